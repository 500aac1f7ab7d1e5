"""Running a request's generations: submit all choices, collect them for a whole response
or merge them into an SSE stream; a client that goes away cancels its generations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..errors import SuperfluidError, WorkerCrashed
from ..request import Chunk, GenRequest
from ..session.events import Message
from . import openai as oa
from .sse import DONE, cursor, event

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def submit_all(engine, reqs: list[GenRequest], bodies: list | None = None, *, api: str,
                     params: dict | None = None) -> list[AsyncIterator[Chunk]]:
    """Submit a request's generations. With a session log, each is a session: `bodies` are
    the prompt's events (one raw prompt message when not given), committed first."""
    if engine.log is not None:
        params = dict(params or {})
        if bodies is None:
            bodies = [Message("prompt", engine.tokenizer.decode(reqs[0].prompt), tuple(reqs[0].prompt))]
            params["raw"] = True
        return await engine.log.open_request(engine, reqs, bodies, api=api, params=params)
    streams: list = []
    try:
        for r in reqs:
            streams.append(engine.submit(r))
    except Exception:
        for r in reqs[:len(streams)]:
            engine.cancel(r.id)
        raise
    return streams


async def collect(request: Request, streams: list[AsyncIterator[Chunk]]) -> list[oa.Choice]:
    choices = [oa.Choice() for _ in streams]

    async def one(i: int, it: AsyncIterator[Chunk]) -> None:
        async for c in it:
            choices[i].add(c)

    task = asyncio.ensure_future(asyncio.gather(*(one(i, it) for i, it in enumerate(streams))))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                task.result()
                return choices
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def raise_first_error(choices: list[oa.Choice]) -> None:
    for c in choices:
        if c.error is not None:
            if isinstance(c.error, SuperfluidError):
                raise c.error
            raise WorkerCrashed(str(c.error))


async def merge(streams: list[AsyncIterator[Chunk]]) -> AsyncIterator[tuple[int, Chunk]]:
    if len(streams) == 1:
        async for c in streams[0]:
            yield 0, c
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, it: AsyncIterator[Chunk]) -> None:
        async for c in it:
            await q.put((i, c))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, c = await q.get()
            if c.finish is not None:
                left -= 1
            yield i, c
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class ClientGone(Exception):
    """The client hung up before its whole response was ready."""


class _EngineStream(StreamingResponse):
    """An SSE response that cancels its generations however it ends: a client that hangs
    up before the first event would otherwise leave them running unobserved."""

    def __init__(self, gen: AsyncIterator[bytes], on_close: Callable[[], None],
                 media_type: str = "text/event-stream", headers: dict | None = None):
        super().__init__(gen, media_type=media_type, headers={**SSE_HEADERS, **(headers or {})})
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def session_header(reqs: list[GenRequest]) -> dict:
    ids = [r.session for r in reqs if r.session]
    return {"x-superfluid-session": ",".join(ids)} if ids else {}


def sse(gen: AsyncIterator[bytes], engine, reqs: list[GenRequest],
        media_type: str = "text/event-stream") -> StreamingResponse:
    """A streamed response whose generations are cancelled however it ends; a session's
    generation instead gets the grace period to be resumed (Sessions.unwatch)."""
    sessions = engine.log
    if sessions is None or not all(r.session for r in reqs):
        def cancel() -> None:
            for r in reqs:
                engine.cancel(r.id)
        return _EngineStream(gen, cancel, media_type)
    watched = []
    for r in reqs:
        engine.keep_running(r.id)
        watched.append(sessions.watch(r.session))

    def unwatch() -> None:
        for g in watched:
            sessions.unwatch(g)
    return _EngineStream(gen, unwatch, media_type, session_header(reqs))


def _error_event(c: Chunk) -> bytes:
    err = c.error if isinstance(c.error, SuperfluidError) else WorkerCrashed(str(c.error))
    return event(err.body())


def record(rec: dict | None, choices_done: list[Chunk]) -> None:
    """Fill the access-log record (counts and timings, never content) from final chunks."""
    if rec is None or not choices_done:
        return
    first = choices_done[0]
    rec.update(prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
               completion_tokens=sum(c.completion_tokens for c in choices_done),
               finish=first.finish.openai if first.finish else None,
               ttft_s=min((c.ttft_s for c in choices_done if c.ttft_s is not None), default=None))


async def _events(kind: str, rid: str, model: str, streams, want_logprobs: bool, include_usage: bool,
                  rec: dict | None, sessions: list[str | None]) -> AsyncIterator[bytes]:
    """SSE events of a chat completion (kind "chat") or a completion ("text"). Events with
    committed tokens carry their log cursor as the SSE id."""
    created = int(time.time())
    chat = kind == "chat"
    if chat:
        for i in range(len(streams)):
            yield event(oa.chat_chunk(rid, model, created, i, {"role": "assistant", "content": ""}))
    offsets = [0] * len(streams)
    finals: list[Chunk] = []
    calls = [0] * len(streams)  # tool calls streamed so far, per choice
    async for i, c in merge(streams):
        eid = cursor(sessions[i], c.event_id)
        if chat and c.reasoning:
            yield event(oa.chat_chunk(rid, model, created, i, {"reasoning_content": c.reasoning}))
        if chat:
            for call in c.tool_calls:
                head = {"index": calls[i], "id": call.id, "type": "function",
                        "function": {"name": call.name, "arguments": ""}}
                yield event(oa.chat_chunk(rid, model, created, i, {"tool_calls": [head]}))
                yield event(oa.chat_chunk(rid, model, created, i, {"tool_calls": [
                    {"index": calls[i], "function": {"arguments": call.arguments}}]}))
                calls[i] += 1
        if c.text or (want_logprobs and c.logprobs):
            if chat:
                lp = oa.chat_logprobs(c.logprobs) if want_logprobs else None
                yield event(oa.chat_chunk(rid, model, created, i, {"content": c.text}, logprobs=lp),
                            None if c.finish is not None else eid)
            else:
                lp = oa.completion_logprobs(c.logprobs, offsets[i]) if want_logprobs else None
                yield event(oa.completion_chunk(rid, model, created, i, c.text, logprobs=lp),
                            None if c.finish is not None else eid)
            offsets[i] += len(c.text)
        if c.finish is not None:
            finals.append(c)
            if c.error is not None:
                yield _error_event(c)
            final = (oa.chat_chunk(rid, model, created, i, {}, oa.finish_reason(c.finish, calls[i] > 0)) if chat
                     else oa.completion_chunk(rid, model, created, i, "", c.finish.openai))
            final["usage"] = oa.usage(c.prompt_tokens, c.completion_tokens, c.cached_tokens)
            yield event(final, eid)
    record(rec, finals)
    if include_usage and finals:
        yield event({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": created, "model": model, "choices": [],
                     "usage": oa.usage(finals[0].prompt_tokens, sum(c.completion_tokens for c in finals),
                                       finals[0].cached_tokens)})
    yield DONE


def chat_events(rid, model, streams, want_logprobs, include_usage, rec=None, reqs=()) -> AsyncIterator[bytes]:
    sessions = [r.session for r in reqs] or [None] * len(streams)
    return _events("chat", rid, model, streams, want_logprobs, include_usage, rec, sessions)


def completion_events(rid, model, streams, want_logprobs, include_usage, rec=None, reqs=()) -> AsyncIterator[bytes]:
    sessions = [r.session for r in reqs] or [None] * len(streams)
    return _events("text", rid, model, streams, want_logprobs, include_usage, rec, sessions)
