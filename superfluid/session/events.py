"""The session log's record types and their encoding.

A session is a dense sequence of events (ids from 0). Each event is stored as a kind name
plus a msgpack body; `Event` is the envelope (id, epoch, timestamp, body). Spans are the
exact token ids put on the model input, so the log, not the KV cache, is the truth."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import msgpack

# A generation's end, as the log spells it. A turn cut by these stays open: generating
# again continues it.
OPEN_FINISHES = frozenset({None, "length", "cancelled", "error", "dropped"})


@dataclass(frozen=True, slots=True)
class Created:
    """The first event of a session (or, in a fork, the first event after the shared part)."""
    parent: str | None = None
    fork_at: int | None = None
    params: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # system, user, assistant, tool... or "prompt" for a raw completion prompt
    text: str
    span: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GenerationPrompt:
    """The assistant-turn opener the template adds before generating."""
    span: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Generated:
    """Tokens one scheduler step produced for this session (usually one) and the typed
    output they released (codec/output.py): content text, reasoning text, tool-call pieces
    (`CallDelta.to_wire()` lists) and, when the request asked for them, the logprobs of the
    content tokens. The last one says how the generation ended, with the caller's stop
    string that matched; the first and the last carry the prompt tokens whose KV was reused."""
    span: tuple[int, ...]
    text: str = ""
    finish: str | None = None
    reasoning: str = ""
    calls: tuple = ()
    logprobs: tuple = ()  # (token, bytes, logprob, ((token, bytes, logprob), ...)) per content token
    stop_sequence: str | None = None
    cached: int = 0


@dataclass(frozen=True, slots=True)
class ToolUse:
    name: str
    arguments: str
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    content: str
    span: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EpochBump:
    """A new owner (a restarted daemon) took the session over; older owners are fenced."""
    epoch: int


@dataclass(frozen=True, slots=True)
class Meta:
    title: str | None = None
    archived: bool | None = None


@dataclass(frozen=True, slots=True)
class Trim:
    """The session's context now ends after event `to`; later events stay in the log."""
    to: int


@dataclass(frozen=True, slots=True)
class Purge:
    """Logically deleted: hidden from lists, refused for new work."""


Body = Created | Message | GenerationPrompt | Generated | ToolUse | ToolResult | EpochBump | Meta | Trim | Purge

KINDS: dict[str, type] = {
    "created": Created, "message": Message, "generation_prompt": GenerationPrompt,
    "generated": Generated, "tool_use": ToolUse, "tool_result": ToolResult,
    "epoch_bump": EpochBump, "meta": Meta, "trim": Trim, "purge": Purge,
}
KIND_OF: dict[type, str] = {v: k for k, v in KINDS.items()}


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    epoch: int
    ts: float
    body: Body

    @property
    def kind(self) -> str:
        return KIND_OF[type(self.body)]

    def to_json(self, session: str) -> dict:
        """The API's view of an event."""
        return {"session": session, "id": self.id, "epoch": self.epoch, "ts": self.ts,
                "type": self.kind, **body_dict(self.body)}


def body_dict(body: Body) -> dict:
    d = asdict(body)
    for k, v in d.items():
        if isinstance(v, tuple):
            d[k] = list(v)
    return d


def encode(body: Body) -> tuple[str, bytes]:
    return KIND_OF[type(body)], msgpack.packb(body_dict(body), use_bin_type=True)


_TUPLES = frozenset({"span", "calls", "logprobs"})


def decode(kind: str, data: bytes) -> Body:
    cls = KINDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}")
    raw = msgpack.unpackb(data, raw=False)
    if not isinstance(raw, dict):
        raise ValueError(f"event body of kind {kind!r} is not a map")
    names = {f.name for f in fields(cls)}
    args = {k: tuple(v) if k in _TUPLES else v for k, v in raw.items() if k in names}
    return cls(**args)
