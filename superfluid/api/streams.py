"""A request's generations as a response: collect them for a whole response or merge them
into an SSE stream (the OpenAI translators live here); a client that goes away cancels its
generations, or leaves a session's to be resumed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..request import Chunk, GenRequest
from . import openai as oa
from . import resume
from .sse import DONE, cursor, event, frame, tagged

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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
            raise c.error


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


def access_record(request: Request) -> dict:
    """The access log's record for this request (scope state "access"): the log middleware
    writes it out when the response is done; Service.submit fills in the model, class,
    counts and timings (never content)."""
    return request.scope.setdefault("state", {}).setdefault("access", {})


KEEPALIVE_S = 15.0  # most seconds an event stream goes without a byte (a long prefill)
COMMENT = b": keepalive\n\n"  # an SSE comment: every client's parser skips it


def sse(gen: AsyncIterator[bytes], on_close: Callable[[], None], reqs: list[GenRequest],
        media_type: str = "text/event-stream", keepalive: bytes | None = COMMENT) -> StreamingResponse:
    """A streamed response that runs `on_close` however it ends (Service.on_close: a
    session's generation gets the grace period to be resumed, any other is cancelled).
    An event stream sends `keepalive` when it has had nothing to say for KEEPALIVE_S (a
    long prompt being prefilled): clients with an idle timeout on bytes do not give up and
    retry, and a client that went away is noticed then, not at the first token. (Claude
    Code's 300 s stream-idle timeout counts content only: `launch` raises it.) NDJSON
    streams (Ollama's) have no such frame."""
    if media_type != "text/event-stream":
        keepalive = None
    return _EngineStream(gen if keepalive is None else kept_alive(gen, keepalive, KEEPALIVE_S), on_close,
                         media_type, session_header(reqs))


async def kept_alive(gen: AsyncIterator[bytes], frame: bytes, every: float) -> AsyncIterator[bytes]:
    """`gen`'s bytes, with `frame` whenever `every` seconds pass without one. The wait for
    the next item is never cancelled by the timer (that would end the generation)."""
    it = gen.__aiter__()
    nxt: asyncio.Future | None = None
    try:
        while True:
            if nxt is None:
                nxt = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({nxt}, timeout=every)
            if not done:
                yield frame
                continue
            fut, nxt = nxt, None
            try:
                item = fut.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if nxt is not None:
            nxt.cancel()
            await asyncio.gather(nxt, return_exceptions=True)
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


def timings(c: Chunk, wall_s: float) -> dict:
    """llama-server's timings from the final chunk: the prompt's time is to the first token."""
    prompt_n, predicted_n = max(0, c.prompt_tokens - c.cached_tokens), c.completion_tokens
    prompt_ms = 1e3 * (c.ttft_s if c.ttft_s is not None else wall_s)
    predicted_ms = max(0.0, 1e3 * wall_s - prompt_ms)
    return {"cache_n": c.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1e3 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0}


def _error_event(c: Chunk) -> bytes:
    assert c.error is not None
    return frame(c.error.body())


async def _events(kind: str, rid: str, model: str, streams, want_logprobs: bool, include_usage: bool,
                  sessions: list[str | None], created: int,
                  indices: list[int] | None = None, with_timings: bool = False) -> AsyncIterator[bytes]:
    """SSE events of a chat completion (kind "chat") or a completion ("text") from typed
    output chunks, live or replayed from the log (api/resume.py). Each chunk's frames carry
    its log cursor on the last one. `with_timings` (llama-server's `timings_per_token`):
    each choice's last chunk, and the usage chunk, carry llama-server's `timings`."""
    t0 = time.monotonic()
    chat = kind == "chat"
    idx = indices or list(range(len(streams)))
    if chat:
        for i in idx:
            # content null, as llama-server sends it (OpenAI sends ""): a content delta is never
            # empty, so a client may take any content it sees for text
            yield event(oa.chat_chunk(rid, model, created, i, {"role": "assistant", "content": None}))
    offsets = [0] * len(streams)
    finals: list[Chunk] = []
    calls = [False] * len(streams)  # a tool call was started, per choice
    async for k, c in merge(streams):
        i = idx[k]
        out: list[bytes] = []
        if c.progress is not None:
            out.append(frame({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                              "created": created, "model": model, "choices": [],
                              "prompt_progress": oa.prompt_progress(c.progress)}))
        if chat and c.reasoning:
            out.append(frame(oa.chat_chunk(rid, model, created, i, {"reasoning_content": c.reasoning})))
        if c.text or (want_logprobs and c.logprobs):
            if chat:
                lp = oa.chat_logprobs(c.logprobs) if want_logprobs else None
                out.append(frame(oa.chat_chunk(rid, model, created, i, {"content": c.text or None}, logprobs=lp)))
            else:
                lp = oa.completion_logprobs(c.logprobs, offsets[k]) if want_logprobs else None
                out.append(frame(oa.completion_chunk(rid, model, created, i, c.text, logprobs=lp)))
            offsets[k] += len(c.text)
        if chat:
            for d in c.calls:
                if d.start:
                    calls[k] = True
                    out.append(frame(oa.chat_chunk(rid, model, created, i, {"tool_calls": [
                        {"index": d.index, "id": d.id, "type": "function",
                         "function": {"name": d.name, "arguments": ""}}]})))
                if d.arguments:
                    out.append(frame(oa.chat_chunk(rid, model, created, i, {"tool_calls": [
                        {"index": d.index, "function": {"arguments": d.arguments}}]})))
        if c.finish is not None:
            finals.append(c)
            if c.error is not None:
                out.append(_error_event(c))
            final = (oa.chat_chunk(rid, model, created, i, {}, oa.finish_reason(c.finish, calls[k])) if chat
                     else oa.completion_chunk(rid, model, created, i, "", c.finish.openai))
            final["usage"] = oa.usage(c.prompt_tokens, c.completion_tokens, c.cached_tokens)
            if with_timings:
                final["timings"] = timings(c, time.monotonic() - t0)
            out.append(frame(final))
        for o in tagged(out, cursor(sessions[k], c.event_id)):
            yield o
    if include_usage and finals:
        last: dict = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                      "created": created, "model": model, "choices": [],
                      "usage": oa.usage(finals[0].prompt_tokens, sum(c.completion_tokens for c in finals),
                                        finals[0].cached_tokens)}
        if with_timings:
            last["timings"] = timings(finals[0], time.monotonic() - t0)
        yield event(last)
    yield DONE


def chat_events(rid, model, streams, want_logprobs, include_usage, reqs=(), *,
                created: int, with_timings: bool = False) -> AsyncIterator[bytes]:
    sessions = [r.session for r in reqs] or [None] * len(streams)
    return _events("chat", rid, model, streams, want_logprobs, include_usage, sessions, created,
                   with_timings=with_timings)


def completion_events(rid, model, streams, want_logprobs, include_usage, reqs=(), *,
                      created: int) -> AsyncIterator[bytes]:
    sessions = [r.session for r in reqs] or [None] * len(streams)
    return _events("text", rid, model, streams, want_logprobs, include_usage, sessions, created)


def _replay(kind: str):
    def translate(sid: str, p: dict, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
        return _events(kind, str(p.get("response_id") or sid), str(p.get("model") or ""), [chunks],
                       bool(p.get("logprobs")), bool(p.get("include_usage")), [sid],
                       int(p.get("created") or 0), [int(p.get("index") or 0)], bool(p.get("timings")))
    return translate


resume.register("chat.completions", _replay("chat"))
resume.register("completions", _replay("text"))
