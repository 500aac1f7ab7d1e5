"""Streams read from the session log: the rest of a generation after a cursor (resuming a
dropped stream, in the format of the API that started it) and a session's subscription
(every event from a cursor, then live ones). Both subscribe before reading the backlog, so
an event lands in one or the other and is sent once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from ..request import FinishReason
from ..session.events import EpochBump, Event, Generated, Meta, ToolUse
from ..sessions import BEHIND
from . import openai as oa
from .sse import DONE, cursor, event

PING_S = 15.0
INTERRUPTED = ("the generation was interrupted (the daemon stopped); generate on the session again to "
               "continue it")


def _openai_finish(name: str | None) -> str:
    try:
        return FinishReason[(name or "error").upper()].openai
    except KeyError:
        return "stop"


class _Format:
    """Turns one generation's log events into one API's stream events."""

    def __init__(self, sid: str, params: dict, api: str | None):
        self.sid, self.params = sid, params
        self.kind = {"chat.completions": "chat", "completions": "text"}.get(api or "", "native")
        self.rid = params.get("response_id") or sid
        self.model = params.get("model") or ""
        self.index = int(params.get("index") or 0)
        self.created = int(time.time())

    def generated(self, ev: Event) -> list[bytes]:
        b = ev.body
        assert isinstance(b, Generated)
        cur = cursor(self.sid, ev.id)
        if self.kind == "native":
            return [event(ev.to_json(self.sid), cur)]
        out = []
        if b.text:
            out.append(event(oa.chat_chunk(self.rid, self.model, self.created, self.index, {"content": b.text})
                             if self.kind == "chat" else
                             oa.completion_chunk(self.rid, self.model, self.created, self.index, b.text),
                             None if b.finish else cur))
        if b.finish is not None:
            fin = _openai_finish(b.finish)
            out.append(event(oa.chat_chunk(self.rid, self.model, self.created, self.index, {}, fin)
                             if self.kind == "chat" else
                             oa.completion_chunk(self.rid, self.model, self.created, self.index, "", fin), cur))
        return out

    def other(self, ev: Event) -> list[bytes]:
        return [event(ev.to_json(self.sid), cursor(self.sid, ev.id))] if self.kind == "native" else []

    def interrupted(self) -> list[bytes]:
        if self.kind == "native":
            return [event({"type": "interrupted", "session": self.sid, "message": INTERRUPTED})]
        return [event({"error": {"message": INTERRUPTED, "type": "server_error", "param": None,
                                 "code": "generation_interrupted"}})]


def _behind(sid: str, last: int) -> bytes:
    """The reader fell too far behind the live events: reconnect from the cursor."""
    return event({"type": "behind", "session": sid, "resume_after": last,
                   "message": "this stream fell behind; reconnect with Last-Event-ID to read on from the log"})


async def _next(q: asyncio.Queue):
    try:
        return await asyncio.wait_for(q.get(), PING_S)
    except TimeoutError:
        return None


async def rest_of_generation(sessions, sid: str, after: int,
                             resume: Callable[[], Awaitable[object]] | None = None) -> AsyncIterator[bytes]:
    """The generation's events after event `after`, live while it runs, then [DONE]. A
    generation a restart cut off is continued by `resume` (which starts generating on the
    session again and returns its watcher, or None when it cannot), so the stream still
    ends with the whole generation; without it, it ends with an `interrupted` event."""
    q = sessions.subscribe(sid)
    gen = sessions.watch(sid)  # a live generation: this stream now counts as its watcher
    try:
        st = await sessions.state(sid)
        row = await sessions.row(sid)
        fmt = _Format(sid, st.params, row.api)
        backlog = await sessions.store.events(sid, after=after)
        last = after

        def take(ev: Event) -> tuple[list[bytes], bool]:
            """(what to send, whether the generation ended)."""
            b = ev.body
            if isinstance(b, Generated):
                return fmt.generated(ev), b.finish is not None
            if isinstance(b, ToolUse):
                return fmt.other(ev), False
            if isinstance(b, Meta):  # a title change while it ran is not the generation's end
                return [], False
            return (fmt.interrupted(), True) if isinstance(b, EpochBump) else ([], True)

        for ev in backlog:
            if isinstance(ev.body, EpochBump) and resume is not None:
                started = await resume()
                if started is not None:  # the rest comes live, from the continuation
                    sessions.unwatch(gen)
                    gen = started
                    last = ev.id
                    break
            out, ended = take(ev)
            for o in out:
                yield o
            last = ev.id
            if ended:
                yield DONE
                return
        while True:
            if q.empty() and not sessions.busy(sid):  # nothing live: the log had it all
                yield DONE
                return
            ev = await _next(q)
            if ev is None:
                yield b": ping\n\n"
                continue
            if ev is BEHIND:
                yield _behind(sid, last)
                return
            if ev.id <= last:
                continue
            last = ev.id
            out, ended = take(ev)
            for o in out:
                yield o
            if ended:
                yield DONE
                return
    finally:
        sessions.unsubscribe(sid, q)
        sessions.unwatch(gen)


async def subscription(sessions, sid: str, after: int) -> AsyncIterator[bytes]:
    """Every event of the session after `after`, then live events as they commit."""
    q = sessions.subscribe(sid)
    try:
        await sessions.state(sid)
        last = after
        for ev in await sessions.store.events(sid, after=after):
            yield event(ev.to_json(sid), cursor(sid, ev.id))
            last = ev.id
        while True:
            ev = await _next(q)
            if ev is None:
                yield b": ping\n\n"
            elif ev is BEHIND:
                yield _behind(sid, last)
                return
            elif ev.id > last:
                last = ev.id
                yield event(ev.to_json(sid), cursor(sid, ev.id))
    finally:
        sessions.unsubscribe(sid, q)
