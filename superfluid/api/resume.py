"""Streams read from the session log: the rest of a generation after a cursor (resuming a
dropped stream) and a session's subscription (every event from a cursor, then live ones).
Both subscribe before reading the backlog, so an event lands in one or the other and is
sent once.

A resumed stream is the API's own stream: the generation's logged output events become
Chunks again and go through the same translator as the live stream did (registered here by
each API), and what it produces up to the cursor is dropped. So the client gets, in its own
format, what the live stream would have sent after that cursor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from ..errors import SuperfluidError, WorkerCrashed
from ..request import CallDelta, Chunk, FinishReason, TokenLogprob
from ..session.events import EpochBump, Event, Generated, Meta, ToolUse
from ..service import BEHIND
from .sse import DONE, cursor, event

PING_S = 15.0
INTERRUPTED = ("the generation was interrupted (the daemon stopped); generate on the session again to "
               "continue it")

# api name -> (translator(session, params, chunks) -> stream bytes, media type)
Translator = Callable[[str, dict, AsyncIterator[Chunk]], AsyncIterator[bytes]]
_TRANSLATORS: dict[str, tuple[Translator, str]] = {}


def register(api: str, translate: Translator, media_type: str = "text/event-stream") -> None:
    """How a stream of the API `api` (the session row's api) is resumed."""
    _TRANSLATORS[api] = (translate, media_type)


def media_type(api: str | None) -> str:
    entry = _TRANSLATORS.get(api or "")
    return entry[1] if entry else "text/event-stream"


class GenerationInterrupted(SuperfluidError):
    code = "generation_interrupted"


def chunk_of(ev: Event, request_id: str, prompt_tokens: int, n_out: int) -> Chunk:
    """A logged Generated event as the Chunk the live stream had (n_out: tokens so far)."""
    b = ev.body
    assert isinstance(b, Generated)
    finish = None
    if b.finish is not None:
        finish = FinishReason.__members__.get(b.finish.upper(), FinishReason.END_OF_TURN)
    err = WorkerCrashed("the generation failed") if finish == FinishReason.ERROR else None
    return Chunk(request_id, text=b.text, tokens=list(b.span), finish=finish, prompt_tokens=prompt_tokens,
                 completion_tokens=n_out, cached_tokens=b.cached, stop_sequence=b.stop_sequence, error=err,
                 event_id=ev.id, reasoning=b.reasoning, calls=[CallDelta.from_wire(d) for d in b.calls],
                 logprobs=[TokenLogprob(int(t), bytes(x), float(lp), tuple((int(a), bytes(y), float(v))
                                                                          for a, y, v in top))
                           for t, x, lp, top in b.logprobs])


def _cut(b) -> bool:
    """A restart (epoch bump) or its client going away (finish "dropped") cut the generation."""
    return isinstance(b, EpochBump) or (isinstance(b, Generated) and b.finish == "dropped")


async def _continued(sessions, sid: str, pending: list[Event]) -> bool:
    """Whether a cut generation goes on already: the log has more of it, or a continuation
    runs now. (The dropped generation itself may still be finishing its last commit: wait.)"""
    gen = sessions.live.running(sid)
    if gen is not None and gen.dropped:
        await gen.ended.wait()
    return any(isinstance(e.body, Generated) for e in pending) or sessions.busy(sid)


class _Behind(Exception):
    def __init__(self, last: int):
        self.last = last


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
                             resume: Callable[[], Awaitable[object]] | None = None,
                             frame: int | None = None) -> AsyncIterator[bytes]:
    """The generation's events after event `after` (with `frame`: after frame `frame` of
    event `after`'s chunk, sse.tagged), live while it runs, in the format of the
    API that started it. A generation cut by a restart or by its client going away (finish
    "dropped") is continued by `resume` (which starts generating on the session again and
    returns its watcher, or None when it cannot), so the stream still ends with the whole
    generation; a restart's cut that cannot go on ends with the API's error event (code
    generation_interrupted)."""
    q = sessions.subscribe(sid)
    watching = [sessions.watch(sid)]  # a live generation: this stream now counts as its watcher
    try:
        st = await sessions.state(sid)
        row = await sessions.row(sid)
        entry = _TRANSLATORS.get(row.api or "")
        if entry is None:
            async for b in _native(sessions, sid, after if frame is None else after - 1, q, watching, resume):
                yield b
            return
        # the generation starts after the last input: the assistant-turn opener, or the raw
        # prompt of a completion (which has no template, so no opener)
        opener = max((e.event_id for e in st.entries if e.kind in ("generation_prompt", "message", "tool_result")),
                     default=-1)
        backlog = list(await sessions.store.events(sid, after=opener))
        params = st.params
        rid = str(params.get("response_id") or sid)
        prompt_tokens = int(params.get("prompt_tokens") or 0)
        first = next((ev.id for ev in backlog if isinstance(ev.body, Generated)), None)
        part = None if frame is None else (after, frame + 1)  # (event, frames of its chunk seen)
        drop = [first is not None and first <= after, 0]
        if part is not None:
            after -= 1  # that event's chunk is rendered again, less the frames seen

        async def chunks() -> AsyncIterator[Chunk]:
            n_out, last = 0, opener
            cached: int | None = None  # the generation's own: a continuation's is not the client's
            pending = list(backlog)
            while True:
                if pending:
                    ev = pending.pop(0)
                else:
                    if q.empty() and not sessions.busy(sid):  # nothing live: the log had it all
                        break
                    ev = await q.get()
                    if ev is BEHIND:
                        raise _Behind(last)
                    if ev.id <= last:
                        continue
                last = ev.id
                b = ev.body
                if _cut(b):  # a restart, or its client going away, cut it: it goes on from here
                    if await _continued(sessions, sid, pending):
                        continue
                    started = await resume() if resume is not None else None
                    if started is not None:
                        watching.append(started)
                        continue
                    if isinstance(b, EpochBump):
                        yield Chunk(rid, finish=FinishReason.ERROR, error=GenerationInterrupted(INTERRUPTED),
                                    prompt_tokens=prompt_tokens, completion_tokens=n_out)
                        break
                if isinstance(b, Generated):
                    n_out += len(b.span)
                    c = chunk_of(ev, rid, prompt_tokens, n_out)
                    cached = c.cached_tokens if cached is None else cached
                    c.cached_tokens = cached
                    yield c
                    if c.finish is not None:
                        break
                elif not isinstance(b, (Meta, ToolUse)):
                    break

        async for b in after_cursor(entry[0](sid, params, marked(chunks(), after, drop, part)), drop, sid):
            yield b
    finally:
        sessions.unsubscribe(sid, q)
        for g in watching:
            sessions.unwatch(g)


async def marked(chunks: AsyncIterator[Chunk], after: int, drop: list,
                 part: tuple[int, int] | None = None) -> AsyncIterator[Chunk]:
    """The chunks, with drop[0] telling whether the one the translator reads now was at or
    before the cursor (what it says for that chunk, the client had) and drop[1] how many of
    its frames the client had (part: (event, frames) of a chunk the client saw in part)."""
    async for c in chunks:
        drop[0] = c.event_id is not None and c.event_id <= after
        drop[1] = part[1] if part is not None and c.event_id == part[0] else 0
        yield c
    drop[0], drop[1] = False, 0  # what a stream says after its last chunk comes after every cursor


async def after_cursor(stream: AsyncIterator[bytes], drop: list, sid: str) -> AsyncIterator[bytes]:
    """The translator's output, minus what it says while `drop` is set, with a comment line
    when nothing came for PING_S (a proxy must not close an idle stream)."""
    out: asyncio.Queue = asyncio.Queue()
    end = b""  # the pump is done

    async def pump() -> None:
        try:
            async for b in stream:
                if drop[0]:
                    continue
                if drop[1] > 0:  # a frame of a chunk the client saw in part, before its cut
                    drop[1] -= 1
                    continue
                await out.put(b)
        except _Behind as e:
            await out.put(_behind(sid, e.last))
        finally:
            await out.put(end)

    task = asyncio.create_task(pump())
    try:
        while True:
            b = await _next(out)
            if b is None:
                yield b": ping\n\n"
            elif b is end:
                return
            else:
                yield b
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _native(sessions, sid: str, after: int, q: asyncio.Queue, watching: list,
                  resume: Callable[[], Awaitable[object]] | None) -> AsyncIterator[bytes]:
    """A native session's generation: its events after the cursor, as the session API has
    them. One cut by a restart or by its client going away goes on through `resume`."""
    last = after
    pending = await sessions.store.events(sid, after=after)
    if not pending and after >= 0:  # the reader has it all; was it cut right at the cursor?
        at = await sessions.store.events(sid, after=after - 1, limit=1)
        if at and _cut(at[0].body) and not await _continued(sessions, sid, []):
            started = await resume() if resume is not None else None
            if started is None:
                yield DONE
                return
            watching.append(started)
    while True:
        if pending:
            ev = pending.pop(0)
        else:
            if q.empty() and not sessions.busy(sid):
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
        b = ev.body
        if _cut(b):
            if await _continued(sessions, sid, pending):
                continue
            started = await resume() if resume is not None else None
            if started is not None:  # the rest comes live, from the continuation
                watching.append(started)
                continue
        out, ended = _native_event(sid, ev)
        for o in out:
            yield o
        if ended:
            yield DONE
            return


def _native_event(sid: str, ev: Event) -> tuple[list[bytes], bool]:
    """(what to send, whether the generation ended)."""
    b = ev.body
    if isinstance(b, Generated):
        return [event(ev.to_json(sid), cursor(sid, ev.id))], b.finish is not None
    if isinstance(b, ToolUse):
        return [event(ev.to_json(sid), cursor(sid, ev.id))], False
    if isinstance(b, Meta):  # a title change while it ran is not the generation's end
        return [], False
    if isinstance(b, EpochBump):
        return [event({"type": "interrupted", "session": sid, "message": INTERRUPTED})], True
    return [], True


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
