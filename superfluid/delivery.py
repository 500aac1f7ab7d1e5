"""Tokens to clients: a request's output stream, and delivery in order after the session
log has committed them. A step's chunks for every session-backed stream are one group
commit; it runs while the engine goes on with the next step, and chunks (and any chunk
pushed off the token path, such as a cancel) reach their queues in order once it resolves."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .codec.channels import Channels
from .codec.detok import TextStream
from .errors import SuperfluidError
from .request import Chunk, FinishReason, GenRequest
from .session.events import Generated


class SessionLog(Protocol):
    """Where a session-backed generation's tokens are committed (sessions.Sessions)."""

    def commit(self, items: list[tuple[GenRequest, Generated]]) -> asyncio.Future:
        """Queue one group commit for a step; resolves to one Event or error per item."""

    def end(self, req: GenRequest, finish: FinishReason) -> None:
        """A generation ended without a committed last token (cancel, worker loss)."""


@dataclass(eq=False)
class Stream:
    """A request's output: detokenizer, channels, its queue of Chunks, timings."""
    req: GenRequest
    text: TextStream
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    n_out: int = 0
    done: bool = False
    keep: bool = False  # the consumer going away does not cancel it (a resumable stream)
    channels: Channels | None = None
    failed: bool = False  # its log commit failed: it ended with that error
    t_submit: float = field(default_factory=time.monotonic)
    ttft_s: float | None = None
    t_last: float = 0.0

    def chunk(self, token: int, finish: FinishReason | None, cached: int) -> Chunk:
        """The chunk of a sampled token: its text (a caller's stop string ends the stream
        there) split into channels; the last one flushes what the detokenizer and channels hold."""
        self.n_out += 1
        text = self.text.push(token)
        if self.text.stopped_by is not None:
            finish = FinishReason.STOP_SEQUENCE
        elif finish is not None:
            text += self.text.finish()
        raw, reasoning, calls = text, "", []
        if self.channels is not None:
            parts = self.channels.feed(text)
            if finish is not None:
                end = self.channels.finish()
                parts.content += end.content
                parts.reasoning += end.reasoning
                parts.calls += end.calls
            text, reasoning, calls = parts.content, parts.reasoning, parts.calls
        return Chunk(self.req.id, text=text, tokens=[token], finish=finish, prompt_tokens=len(self.req.prompt),
                     completion_tokens=self.n_out, cached_tokens=cached,
                     ttft_s=self.ttft_s if finish is not None else None, stop_sequence=self.text.stopped_by,
                     reasoning=reasoning, tool_calls=calls, raw=raw if self.channels is not None else None)

    def final(self, finish: FinishReason, error: Exception | None = None) -> Chunk:
        """The last chunk of a stream ended off the token path (cancel, error, stop)."""
        return Chunk(self.req.id, finish=finish, error=error, prompt_tokens=len(self.req.prompt),
                     completion_tokens=self.n_out)


class Deliveries:
    def __init__(self, log: Callable[[], SessionLog | None], on_fail: Callable[[Stream, Exception], None]):
        self._log = log
        self._on_fail = on_fail  # a stream whose commit failed: end it with the error
        self._pending: deque[tuple[asyncio.Future | None, list[tuple[Stream, Chunk]]]] = deque()
        self._task: asyncio.Task | None = None

    def publish(self, outs: list[tuple[Stream, Chunk]]) -> None:
        """Tokens reach a client only after the log has them."""
        if not outs:
            return
        log = self._log()
        items = [(st.req, Generated(tuple(c.tokens), c.text if c.raw is None else c.raw, "content",
                                    c.finish.log_name if c.finish else None))
                 for st, c in outs if st.req.session is not None]
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
        if self._pending:
            self._pending.append((None, [(st, chunk)]))
        else:
            st.queue.put_nowait(chunk)

    def drop(self) -> list[Stream]:
        """Stop: forget what waits for a commit; returns the streams it held."""
        if self._task is not None:
            self._task.cancel()
        streams = list(dict.fromkeys(st for _, outs in self._pending for st, _ in outs))
        self._pending.clear()
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
                if fut is not None and st.req.session is not None:
                    r = next(it, None)
                    if isinstance(r, Exception):
                        if not st.failed:
                            st.failed = True
                            self._on_fail(st, r)
                        continue
                    c.event_id = r.id if r is not None else None
                if not st.failed:
                    st.queue.put_nowait(c)
