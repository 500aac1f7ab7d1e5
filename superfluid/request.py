"""The canonical request and its output chunks: every API translates onto GenRequest and
from Chunk, so every capability works the same on every API."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .errors import SuperfluidError


class Qos(enum.IntEnum):
    """Service classes. The numbers are the wire and header names and never change; the order
    the scheduler serves them in is `rank` (embedding batches come between agent and
    background work)."""
    INTERACTIVE = 0
    COMPLETION = 1
    AGENT = 2
    BACKGROUND = 3
    EMBEDDING = 4

    @property
    def rank(self) -> float:
        return 2.5 if self is Qos.EMBEDDING else float(self)


class FinishReason(enum.IntEnum):
    END_OF_TURN = 1
    LENGTH = 2
    GRAMMAR = 3
    CANCELLED = 4
    ERROR = 5
    STOP_SEQUENCE = 6  # a caller's stop string matched (OpenAI "stop", Anthropic "stop_sequence")
    DROPPED = 7  # its client went away: cut at once, continued from the log when it resumes

    @property
    def log_name(self) -> str:
        return self.name.lower()

    @property
    def openai(self) -> str:
        return {FinishReason.LENGTH: "length", FinishReason.ERROR: "error"}.get(self, "stop")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What the worker needs to draw a token. temperature 0 is greedy."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    top_logprobs: int = -1  # -1: no logprobs; 0: the chosen token's; n: plus the n best
    ignore_eos: bool = False
    grammar: str = ""  # an llguidance grammar the output must match (codec/grammar.py); "" none
    # new fields go at the end (the wire is positional; plan.GRAMMAR_AT points at `grammar`)
    # (token id, bias) pairs added to the logits before masks and the draw; -100 or less bans
    logit_bias: tuple[tuple[int, float], ...] = ()
    typical_p: float = 1.0  # locally typical sampling: keep the most typical tokens up to this mass; 1 off
    # the penalties (presence, frequency, repeat) count the last n tokens of the lane's context,
    # prompt included (llama.cpp's penalty_last_n); -1: the whole context; 0: penalties off
    repeat_last_n: int = -1
    # logprobs of the distribution the token was drawn from (after temperature, top-k/p, min-p,
    # typical-p and the grammar: llama-server's post_sampling_probs), not of the raw logits
    post_sampling: bool = False

    def __post_init__(self) -> None:
        # from the wire or a session log's JSON the pairs arrive as lists
        b = self.logit_bias
        if not isinstance(b, tuple) or (b and not isinstance(b[0], tuple)):
            object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in self.logit_bias))

    def to_wire(self) -> list:
        return [self.temperature, self.top_p, self.top_k, self.min_p, self.seed,
                self.presence_penalty, self.frequency_penalty, self.repeat_penalty,
                self.top_logprobs, self.ignore_eos, self.grammar, [list(p) for p in self.logit_bias],
                self.typical_p, self.repeat_last_n, self.post_sampling]

    @classmethod
    def from_wire(cls, w: list) -> SamplingParams:
        return cls(*w)  # an older peer's shorter list takes the later fields' defaults

    @property
    def penalized(self) -> bool:
        """Do penalties apply (so the sampler needs the lane's context)?"""
        return self.repeat_last_n != 0 and bool(self.presence_penalty or self.frequency_penalty
                                                or self.repeat_penalty != 1.0)


@dataclass(slots=True)
class GenRequest:
    id: str
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...] = ()
    qos: Qos = Qos.AGENT
    session: str | None = None  # the session whose log records this generation
    channels: Any = None  # codec.channels.ChannelSpec: split reasoning / tool calls from content
    # the end of `prompt` this turn already generated (a continuation or a failover): the
    # sampler's grammar and penalties pick up after it, as if the turn had never been cut
    history: tuple[int, ...] = ()
    # a client's cache hint (Anthropic cache_control): keep the prompt's first n tokens warm
    # for ttl seconds (in memory while a pinned slot is free, on disk in a pinned entry)
    cache: tuple[int, float] | None = None
    # drafts per step this generation may have verified (speculative decoding): None is the
    # engine's own setting; a fleet head passes its own to the node that runs the generation
    speculate: int | None = None
    # False (a `store: false` response): nothing of it goes to the KV disk tier, which would
    # keep its tokens past a restart
    persist: bool = True
    # the prefix cache's namespace (a key's own, and/or a client's cache_salt: cache_ns.py):
    # KV is reused only between generations of one namespace; "" is the shared one
    cache_ns: str = ""
    # prompt-processing progress chunks while its prompt prefills (llama-server's return_progress)
    progress: bool = False


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: int
    text: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A whole tool call, as a non-streamed response gives it."""
    id: str
    name: str
    arguments: str  # JSON text, exactly as the model wrote it

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A piece of a tool call as it is generated: the first one of a call names it (id,
    name), the next ones carry fragments of its arguments, and the last one has `end` set.
    `cut`: the call never closed (the generation ended inside it)."""
    index: int  # the call's number in the turn
    id: str = ""
    name: str = ""
    arguments: str = ""
    end: bool = False
    cut: bool = False

    @property
    def start(self) -> bool:
        return bool(self.name)

    def to_wire(self) -> list:
        return [self.index, self.id, self.name, self.arguments, self.end, self.cut]

    @classmethod
    def from_wire(cls, w) -> CallDelta:
        index, id_, name, args, end, cut = w
        return cls(int(index), str(id_), str(name), str(args), bool(end), bool(cut))


class Calls:
    """Whole calls from a stream of deltas; a call that was cut off is left out."""

    def __init__(self) -> None:
        self._open: dict[int, list] = {}
        self.done: list[ToolCall] = []

    def add(self, deltas: list[CallDelta]) -> None:
        for d in deltas:
            cur = self._open.setdefault(d.index, [d.id, d.name, []])
            if d.start:
                cur[0], cur[1] = d.id, d.name
            cur[2].append(d.arguments)
            if d.end:
                del self._open[d.index]
                if not d.cut:
                    self.done.append(ToolCall(cur[0], cur[1], "".join(cur[2])))


@dataclass(slots=True)
class Chunk:
    """One piece of a generation's output, in order. The last chunk has finish set."""
    request_id: str
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV was reused, not recomputed
    ttft_s: float | None = None  # on the last chunk: seconds from submit to the first token
    stop_sequence: str | None = None  # on the last chunk: the caller's stop string that matched
    error: SuperfluidError | None = None  # on the last chunk of a generation that failed
    event_id: int | None = None  # the session-log event that committed these tokens
    reasoning: str = ""  # reasoning-channel text (content is in `text`)
    calls: list[CallDelta] = field(default_factory=list)  # tool-call pieces, in order
    # a progress chunk (GenRequest.progress), nothing else in it: (prompt tokens, of them taken
    # from the KV cache, of them processed so far, milliseconds since the request came)
    progress: tuple[int, int, int, float] | None = None
