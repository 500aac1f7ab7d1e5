"""Fakes at the engine's seams, so the engine loop, delivery, the service and the API
translators run in one process with no worker process and no model:

- FakeVocab: a tiny tokenizer with the face of codec.tokenizer.Tokenizer (every byte is a
  token, plus chat markers, `<think>` / `<tool_call>` markup and a few words), so a test
  scripts text, reasoning and tool calls as token ids.
- FakeRuntime: a real runtime.base.Runtime. Each lane generates a scripted list of token
  ids (chosen from its prompt), then end-of-turn; `BOOM` in a script makes that step raise.
  Runtime.step (lanes, placeholders, sampling with logprobs) is the shared real one.
- InProcWorker: worker.supervisor.WorkerProcess's face (start, send_step, recv_step, stop,
  alive, pid, kv_entries), running the runtime's steps inline. A runtime error in a step
  surfaces as the WorkerCrashed the real worker's ERROR message becomes, and the "process"
  is dead after it, as the real one exits.
- fake_engine(): a real engine.Engine on these.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from superfluid.codec.tokenizer import ModelShape, Vocab
from superfluid.config import EngineConfig
from superfluid.engine.local import Engine
from superfluid.errors import WorkerCrashed
from superfluid.plan import Run, StepPlan, StepResult
from superfluid.runtime.base import ModelInfo, Runtime

# ChatML, and the reasoning markers (named in a comment): the codec then splits <think>
# spans into reasoning, and with tools parses Hermes-style <tool_call> markup (generic format)
TEMPLATE = (
    "{# reasoning goes between <think> and </think> #}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CONTROL = ["<|im_start|>", "<|im_end|>"]  # special: no text in the output, named by token_text
MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # ordinary tokens, as in Qwen's vocabulary
WORDS = ["Hello", " world", ".", " Once", " upon", " a", " time", " Let", " me", " look", " think", "hm",
         "user", "assistant", "system", '{"name": ', '"f"', ', "arguments": ', '{"a": ', "1", "}}", "\n"]

BOOM = -7  # in a script: the step that would sample it fails in the runtime


class FakeVocab(Vocab):
    """Ids 0..255 are the bytes; then CONTROL, MARKUP and WORDS. Encoding is greedy longest
    match, so any text encodes, and scripted words come out as one token each."""

    def __init__(self, template: str = TEMPLATE, n_ctx_train: int = 4096):
        self.pieces = [bytes([b]) for b in range(256)]
        self.special_pieces: dict[int, bytes] = {}
        ids: dict[str, int] = {}
        for s in CONTROL:
            ids[s] = len(self.pieces)
            self.special_pieces[ids[s]] = s.encode()
            self.pieces.append(b"")
        for w in MARKUP + WORDS:
            if w.encode() not in self.pieces:
                ids[w] = len(self.pieces)
                self.pieces.append(w.encode())
        self.ids = ids
        self.n_vocab = len(self.pieces)
        self.bos = -1
        self.add_bos = False
        self.eos = ids["<|im_end|>"]
        self.eog = frozenset({self.eos})
        self.chat_template = template
        self.shape = ModelShape(n_ctx_train=n_ctx_train, n_layer=2, n_head=2, n_head_kv=2, n_embd=8)
        self._ordinary = {p.decode(): t for t, p in enumerate(self.pieces) if len(p) > 1}
        self._longest = max(len(k) for k in self._ordinary)

    def token_text(self, token: int) -> bytes:
        return self.special_pieces.get(token) or self.pieces[token]

    META = {"general.architecture": "fake", "general.file_type": "7", "general.size_label": "1K"}

    def meta(self, key: str) -> str | None:
        return self.META.get(key)

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            if parse_special:
                hit = next((s for s in CONTROL if text.startswith(s, i)), None)
                if hit is not None:
                    out.append(self.ids[hit])
                    i += len(hit)
                    continue
            for n in range(min(self._longest, len(text) - i), 1, -1):
                t = self._ordinary.get(text[i:i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
            else:  # one character, as its UTF-8 bytes
                out.extend(text[i].encode())
                i += 1
        return out

    def script(self, *parts: str | int) -> list[int]:
        """Token ids for a reply: strings are encoded, ints (BOOM) pass through."""
        out: list[int] = []
        for p in parts:
            out.extend(self.encode(p) if isinstance(p, str) else [p])
        return out


Reply = Callable[[list[int]], Sequence[int]]


def replies(vocab: FakeVocab, by_prompt: dict[str, list[int]], default: Sequence[int] = ()) -> Reply:
    """A reply picked by the first key found in the prompt's text."""
    def pick(prompt: list[int]) -> Sequence[int]:
        text = b"".join(vocab.token_text(t) for t in prompt).decode("utf-8", "replace")
        return next((s for k, s in by_prompt.items() if k in text), default)
    return pick


class FakeRuntime(Runtime):
    """Lanes hold their tokens as KV; a lane samples its script (chosen from its prompt on its
    first sample after opening), then end-of-turn. `batches` records the lanes of every forward."""

    def __init__(self, vocab: FakeVocab, reply: Reply, *, lanes: int = 8, n_ctx: int = 512):
        super().__init__()
        self.vocab = vocab
        self.reply = reply
        self.info = ModelInfo(n_vocab=vocab.n_vocab, n_ctx=n_ctx, n_lanes=lanes, n_ctx_train=n_ctx,
                              description="fake")
        self.eog = np.array(sorted(vocab.eog), dtype=np.int64)
        self.kv: dict[int, list[int]] = {}
        self.batches: list[tuple[int, ...]] = []
        self.prompts: list[list[int]] = []  # each lane's prompt, when its script was chosen
        self.closed = False
        self._generated: dict[int, int] = {}  # seq -> tokens of this turn it had when opened
        self._script: dict[int, list] = {}  # seq -> [script, index of the next token]

    def step(self, plan: StepPlan) -> StepResult:
        for o in plan.opens:
            self._generated[o.seq] = len(o.history)  # a resumed lane picks its script up there
        return super().step(plan)

    def open_lane(self, seq: int, keep: int) -> None:
        self.kv[seq] = self.kv.get(seq, [])[:keep]
        self._script.pop(seq, None)

    def close_lane(self, seq: int) -> None:
        pass  # the KV stays, a prefix-cache entry

    def copy_lane(self, src: int, dst: int, n: int) -> None:
        self.kv[dst] = list(self.kv.get(src, [])[:n])

    def lane_len(self, seq: int) -> int | None:
        return len(self.kv.get(seq, []))

    def forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        self.batches.append(tuple(r.seq for r in runs))
        for r in runs:
            kv = self.kv.setdefault(r.seq, [])
            if len(kv) < r.pos:
                raise ValueError(f"lane {r.seq}: a run at {r.pos} past its KV ({len(kv)} tokens)")
            del kv[r.pos:]
            kv.extend(r.tokens)
        out = {}
        for r in runs:
            if r.sample:
                token = self._next(r.seq)
                if token == BOOM:
                    raise RuntimeError("boom")
                x = np.full(self.vocab.n_vocab, -30.0, dtype=np.float32)
                x[token] = 30.0
                out[r.seq] = x
        return out

    def _next(self, seq: int) -> int:
        s = self._script.get(seq)
        if s is None:
            kv = self.kv[seq]
            prompt = kv[:len(kv) - self._generated.get(seq, 0)]
            self.prompts.append(prompt)
            s = self._script[seq] = [list(self.reply(prompt)), self._generated.get(seq, 0)]
        script, i = s
        s[1] += 1
        return script[i] if i < len(script) else self.vocab.eos

    def close(self) -> None:
        self.closed = True

    def grammar_tokenizer(self):
        """The fake vocabulary as llguidance sees one, so grammars hold the fake's output as
        they hold a real model's (the scripted token loses to what the grammar allows)."""
        import llguidance
        vocab = self.vocab

        class Tokens:
            eos_token_id, bos_token_id = vocab.eos, None
            tokens = [vocab.token_text(t) for t in range(vocab.n_vocab)]
            special_token_ids = sorted(vocab.special_pieces)

            def __call__(self, s):
                return vocab.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s)
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Tokens()))


class InProcWorker:
    """A worker in this process with WorkerProcess's face. Plans queue on send_step and run in
    order on recv_step (after yielding to the event loop, as a real worker answers later)."""

    _pids = itertools.count(1)

    def __init__(self, spec, make_runtime: Callable[[object], Runtime], delay: float = 0.0):
        self.spec = spec
        self.delay = delay  # seconds each step takes, as the loop sees it (a real model's pace)
        self._make = make_runtime
        self.runtime: Runtime | None = None
        self.info: ModelInfo | None = None
        self.kv_entries = None  # no disk tier
        self.pid = next(self._pids)
        self._alive = False
        self._plans: deque[StepPlan] = deque()

    @property
    def alive(self) -> bool:
        return self._alive

    async def start(self) -> ModelInfo:
        try:
            self.runtime = self._make(self.spec)
        except Exception as e:  # the real worker answers HELLO with ERROR and exits
            raise WorkerCrashed(f"the worker failed: {_message(e)}", code=getattr(e, "code", None)) from e
        self._alive = True
        self.info = self.runtime.info
        return self.info

    def send_step(self, plan: StepPlan) -> None:
        if self._alive:  # a dead link surfaces in recv_step
            self._plans.append(StepPlan.from_wire(plan.to_wire()))

    async def recv_step(self) -> StepResult:
        await asyncio.sleep(self.delay)
        if not self._alive or not self._plans or self.runtime is None:
            raise WorkerCrashed("the worker exited")
        plan = self._plans.popleft()
        try:
            result = self.runtime.step(plan)
        except Exception as e:  # the real worker sends ERROR and exits
            self._alive = False
            self.runtime.close()
            raise WorkerCrashed(f"the worker failed: {_message(e)}", code=getattr(e, "code", None)) from e
        return StepResult.from_wire(result.to_wire())

    async def stop(self, timeout: float = 5.0) -> None:
        self._alive = False
        if self.runtime is not None:
            self.runtime.close()


def _message(e: Exception) -> str:
    return getattr(e, "message", None) or f"{type(e).__name__}: {e}"


class FakeModel:
    """What a test drives: the vocabulary, the reply script and every runtime the engine
    started (a respawn starts a new one)."""

    def __init__(self, reply: Reply | None = None, *, vocab: FakeVocab | None = None, n_ctx: int = 512,
                 fail_starts: int = 0, step_delay: float = 0.0):
        self.vocab = vocab or FakeVocab()
        self.reply: Reply = reply or (lambda prompt: self.vocab.script("Hello world."))
        self.n_ctx = n_ctx
        self.runtimes: list[FakeRuntime] = []
        self.fail_starts = fail_starts  # the next this many worker starts fail
        self.step_delay = step_delay  # seconds per step (0: as fast as the loop turns)

    def worker(self, spec) -> InProcWorker:
        return InProcWorker(spec, self._runtime, self.step_delay)

    def _runtime(self, spec) -> FakeRuntime:
        if self.fail_starts > 0:
            self.fail_starts -= 1
            raise RuntimeError("no weights today")
        rt = FakeRuntime(self.vocab, self.reply, lanes=spec.lanes, n_ctx=self.n_ctx)
        self.runtimes.append(rt)
        return rt

    @property
    def runtime(self) -> FakeRuntime:
        return self.runtimes[-1]

    def engine(self, log=None, **cfg) -> Engine:
        # every step's tokens delivered as they come (the loop's tests are written per step;
        # tests/unit/test_stream_interval.py tests the interval)
        ec = EngineConfig(model_path="fake.gguf", model_id="fake", **{"max_batch": 4, "stream_interval_ms": 0, **cfg})
        return Engine(ec, self.vocab, self.n_ctx, log, worker_factory=self.worker)  # type: ignore[arg-type]

    def factory(self):
        """A daemon.EngineFactory: every model the daemon loads is this one, wired as the
        daemon wires a real engine (its session log, metrics hooks and clock)."""
        def make(ec: EngineConfig, log, hooks, clock) -> Engine:
            return Engine(ec, self.vocab, self.n_ctx, log, worker_factory=self.worker,  # type: ignore[arg-type]
                          hooks=hooks, clock=clock)
        return make
