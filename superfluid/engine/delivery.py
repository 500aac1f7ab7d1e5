"""Tokens to clients: a request's output stream, and delivery in order after the session
log has committed them. A step's chunks for every session-backed stream are one group
commit; it runs while the engine goes on with the next step, and chunks (and any chunk
pushed off the token path, such as a cancel) reach their queues in order once it resolves.

With a stream interval (`--stream-interval-ms`), a stream's tokens between two flushes are
one chunk: one log event, one commit for every stream, one event to its client. A stream's
first token and its last chunk flush at once, so time to the first token and to the end are
not delayed; the tokens between wait at most the interval. On a machine whose cores all
decode, what the API process spends per token is taken from the decode (bench/single_stream.py)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..codec.output import OutputProcessor
from ..errors import SuperfluidError
from ..request import Chunk, FinishReason, GenRequest, TokenLogprob
from ..session.events import Generated


class SessionLog(Protocol):
    """Where a session-backed generation's output is committed (service.Sessions); the
    engine knows only this."""

    def commit(self, items: list[tuple[GenRequest, Generated]]) -> asyncio.Future:
        """Queue one group commit for a step; resolves to one Event or error per item."""

    def end(self, req: GenRequest, finish: FinishReason) -> None:
        """A generation ended without a committed last token (cancel, worker loss)."""


@dataclass(eq=False)
class Stream:
    """A request's output: its output processor, its queue of Chunks, timings."""
    req: GenRequest
    out: OutputProcessor | None = None  # None: the chunks come whole (from a fleet node)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    n_out: int = 0
    done: bool = False
    keep: bool = False  # the consumer going away does not cancel it (a resumable stream)
    failed: bool = False  # its log commit failed: it ended with that error
    t_submit: float = field(default_factory=time.monotonic)
    ttft_s: float | None = None
    t_last: float = 0.0

    def chunk(self, token: int, finish: FinishReason | None, cached: int,
              logprob: TokenLogprob | None = None) -> Chunk:
        """The chunk of a sampled token: the typed output it released (a caller's stop
        string ends the stream there); the last one flushes what is held back."""
        assert self.out is not None
        self.n_out += 1
        o = self.out.token(token, finish, logprob)
        return Chunk(self.req.id, text=o.text, tokens=[token], logprobs=o.logprobs, finish=o.finish,
                     prompt_tokens=len(self.req.prompt), completion_tokens=self.n_out, cached_tokens=cached,
                     ttft_s=self.ttft_s if o.finish is not None else None, stop_sequence=o.stop_sequence,
                     reasoning=o.reasoning, calls=o.calls)

    def final(self, finish: FinishReason, error: SuperfluidError | None = None) -> Chunk:
        """The last chunk of a stream ended off the token path (cancel, error, stop)."""
        return Chunk(self.req.id, finish=finish, error=error, prompt_tokens=len(self.req.prompt),
                     completion_tokens=self.n_out)


def logged(c: Chunk, want_logprobs: bool) -> Generated:
    """A chunk as the session log records it."""
    return Generated(tuple(c.tokens), c.text, c.finish.log_name if c.finish else None, c.reasoning,
                     tuple(d.to_wire() for d in c.calls),
                     tuple((lp.token, lp.text, lp.logprob, lp.top) for lp in c.logprobs) if want_logprobs else (),
                     c.stop_sequence, c.cached_tokens if c.finish is not None or c.completion_tokens == 1 else 0)


def merged(a: Chunk, b: Chunk) -> Chunk:
    """Two consecutive token chunks of one stream as one (b the later)."""
    return Chunk(a.request_id, text=a.text + b.text, tokens=a.tokens + b.tokens, logprobs=a.logprobs + b.logprobs,
                 finish=b.finish, prompt_tokens=b.prompt_tokens, completion_tokens=b.completion_tokens,
                 cached_tokens=b.cached_tokens, ttft_s=b.ttft_s, stop_sequence=b.stop_sequence, error=b.error,
                 reasoning=a.reasoning + b.reasoning, calls=a.calls + b.calls)


def _urgent(c: Chunk) -> bool:
    """A chunk that is delivered without waiting for the interval: a stream's first token,
    its last chunk, a progress report."""
    return c.finish is not None or c.completion_tokens <= 1 or c.progress is not None or c.error is not None


class Deliveries:
    def __init__(self, log: SessionLog | None, on_fail: Callable[[Stream, SuperfluidError], None],
                 interval_s: float = 0.0):
        self._log = log
        self._on_fail = on_fail  # a stream whose commit failed: end it with the error
        self._pending: deque[tuple[asyncio.Future | None, list[tuple[Stream, Chunk]]]] = deque()
        self._task: asyncio.Task | None = None
        self.interval_s = interval_s
        self._held: list[tuple[Stream, Chunk]] = []  # chunks waiting for the interval, in order
        self._open: dict[Stream, int] = {}  # stream -> index in _held of its chunk that tokens join
        self._timer: asyncio.TimerHandle | None = None
        self._flushed = float("-inf")  # when the last flush ran (the loop's clock)

    def publish(self, outs: list[tuple[Stream, Chunk]]) -> None:
        """Tokens reach a client only after the log has them; within the stream interval, a
        stream's tokens join one chunk."""
        if not outs:
            return
        if self.interval_s <= 0:  # (nothing is ever held then)
            self._flush(outs)
            return
        urgent = False
        for st, c in outs:
            urgent = urgent or _urgent(c)
            at = self._open.get(st)
            if at is not None and c.progress is None:
                self._held[at] = (st, merged(self._held[at][1], c))
            else:
                self._held.append((st, c))
                if c.progress is None and c.completion_tokens > 1:  # the first token's chunk stays its own
                    self._open[st] = len(self._held) - 1
        now = asyncio.get_running_loop().time()
        if urgent or now - self._flushed >= self.interval_s:
            self._flush_held()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flushed + self.interval_s - now,
                                                                self._flush_held)

    def flush(self) -> None:
        """Commit and deliver what is held for the interval now (a stream ends off the token
        path: its tokens go into the log before its end does)."""
        if self._held:
            self._flush_held()

    def _flush_held(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, []
        self._open.clear()
        self._flushed = asyncio.get_running_loop().time()
        if held:
            self._flush(held)

    def _flush(self, outs: list[tuple[Stream, Chunk]]) -> None:
        log = self._log
        items = [(st.req, logged(c, st.req.sampling.top_logprobs >= 0))
                 for st, c in outs if _logs(st, c)]
        fut = log.commit(items) if items and log is not None else None
        if fut is None and not self._pending:
            for st, c in outs:
                st.queue.put_nowait(c)
            return
        self._pending.append((fut, outs))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="engine-deliver")

    def push(self, st: Stream, chunk: Chunk) -> None:
        """A chunk off the token path, behind any tokens still waiting for their commit."""
        self.flush()
        if self._pending:
            self._pending.append((None, [(st, chunk)]))
        else:
            st.queue.put_nowait(chunk)

    def drop(self) -> list[Stream]:
        """Stop: forget what waits for a commit; returns the streams it held."""
        if self._task is not None:
            self._task.cancel()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held = [st for st, _ in self._held]
        streams = list(dict.fromkeys([st for _, outs in self._pending for st, _ in outs] + held))
        self._pending.clear()
        self._held.clear()
        self._open.clear()
        return streams

    async def _run(self) -> None:
        while self._pending:
            fut, outs = self._pending[0]
            results: list = []
            if fut is not None:
                try:
                    results = await asyncio.shield(fut)  # stopping us must not stop the log's bookkeeping
                except Exception as e:  # noqa: BLE001 -- whatever failed, these streams end, not hang
                    err = e if isinstance(e, SuperfluidError) else SuperfluidError(f"the session log failed: {e}")
                    results = [err] * len(outs)
            self._pending.popleft()
            it = iter(results)
            for st, c in outs:
                if fut is not None and _logs(st, c):
                    r = next(it, None)
                    if isinstance(r, Exception):
                        if not st.failed:
                            st.failed = True
                            self._on_fail(st, r if isinstance(r, SuperfluidError) else
                                          SuperfluidError(f"the session log failed: {r}"))
                        continue
                    c.event_id = r.id if r is not None else None
                if not st.failed:
                    st.queue.put_nowait(c)


def _logs(st: Stream, c: Chunk) -> bool:
    """Does the session log record this chunk? Its tokens do; a progress report does not."""
    return st.req.session is not None and c.progress is None
