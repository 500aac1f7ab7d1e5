"""The Anthropic Messages API (`/v1/messages`), text part: translation onto GenRequest and
from Chunks, with the exact streaming event grammar. Tool use, thinking and images are
refused clearly until the tool-call dialect and grammar engine land."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..errors import BadRequest, ContextLengthExceeded, SuperfluidError
from ..ids import new_id
from ..request import Chunk, FinishReason, GenRequest, SamplingParams
from .schema import number_in
from ..session.turns import prelude
from .sse import cursor
from .streams import collect, raise_first_error, sse, submit_all

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 503: "overloaded_error"}


def error_response(e: SuperfluidError) -> Response:
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}
    return Response(orjson.dumps(body), status_code=e.status, media_type="application/json")


def _sse(event: str, data: dict, id: str | None = None) -> bytes:
    head = b"id: " + id.encode() + b"\n" if id else b""
    return head + b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks", param=where)
    out = []
    for i, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            out.append(b["text"])
        elif kind == "image":
            raise BadRequest("this model takes text only: image blocks are not supported", param=f"{where}.{i}")
        elif kind in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
            raise BadRequest(f"{kind} blocks are not supported yet", param=f"{where}.{i}")
        else:
            raise BadRequest(f"unknown content block {kind!r}", param=f"{where}.{i}")
    return "".join(out)


def conversation(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: a non-empty list is required", param="messages")
    turns = []
    if body.get("system") is not None:
        turns.append({"role": "system", "content": _text(body["system"], "system")})
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest("each message needs role 'user' or 'assistant'", param=f"messages.{i}.role")
        turns.append({"role": m["role"], "content": _text(m.get("content", ""), f"messages.{i}.content")})
    return turns


def gen_request(body: dict, prompt: list[int], n_ctx: int, seed: int, qos) -> GenRequest:
    mt = body.get("max_tokens")
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise BadRequest("max_tokens: a positive integer is required", param="max_tokens")
    if body.get("tools"):
        raise BadRequest("tools are not supported yet", param="tools")
    if (body.get("thinking") or {}).get("type") == "enabled":
        raise BadRequest("this model does not think", param="thinking")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest("stop_sequences must be a list of strings", param="stop_sequences")
    if len(prompt) + mt > n_ctx:
        raise ContextLengthExceeded(f"prompt ({len(prompt)} tokens) plus max_tokens ({mt}) exceeds the "
                                    f"context window of {n_ctx} tokens")
    top_k = body.get("top_k", 0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise BadRequest("top_k must be a non-negative integer", param="top_k")
    sp = SamplingParams(temperature=number_in(body, "temperature", 0, 1, 1.0),
                        top_p=number_in(body, "top_p", 0.001, 1, 1.0), top_k=top_k, seed=seed)
    return GenRequest(new_id("msg"), prompt, sp, mt, tuple(stops), qos)


def stop_reason(c: Chunk) -> str:
    if c.finish == FinishReason.STOP_SEQUENCE:
        return "stop_sequence"
    return "max_tokens" if c.finish == FinishReason.LENGTH else "end_turn"


def usage(c: Chunk, output_tokens: int) -> dict:
    return {"input_tokens": c.prompt_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": c.cached_tokens, "cache_creation_input_tokens": 0}


async def events(rid: str, model: str, prompt_tokens: int, stream, session: str | None = None) -> AsyncIterator[bytes]:
    start: dict = {"id": rid, "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
    yield _sse("message_start", {"type": "message_start", "message": start})
    yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}})
    yield _sse("ping", {"type": "ping"})
    last_ping = time.monotonic()
    async for c in stream:
        if c.text:
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": c.text}},
                       cursor(session, c.event_id))
        if c.finish is not None:
            if c.error is not None:
                err = c.error if isinstance(c.error, SuperfluidError) else SuperfluidError(str(c.error))
                yield _sse("error", {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"),
                                                                "message": err.message}})
                return
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield _sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop_reason(c), "stop_sequence": c.stop_sequence},
                                         "usage": usage(c, c.completion_tokens)})
            yield _sse("message_stop", {"type": "message_stop"})
            return
        if time.monotonic() - last_ping > 10:
            last_ping = time.monotonic()
            yield _sse("ping", {"type": "ping"})


def add_routes(app: FastAPI, models, qos_for, body_of) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request):
        body = await body_of(request)
        eng = await models.get(_model(body))
        bodies, prompt = prelude(eng, conversation(body))
        req = gen_request(body, prompt, eng.n_ctx, eng.new_seed(), qos_for(request))
        streams = await submit_all(eng, [req], bodies, api="anthropic.messages", params={"response_id": req.id})
        if body.get("stream"):
            return sse(events(req.id, eng.model_id, len(prompt), streams[0], req.session), eng, [req])
        choices = await collect(request, streams)
        raise_first_error(choices)
        c = choices[0].last
        assert c is not None  # collect() returns only finished choices
        return {"id": req.id, "type": "message", "role": "assistant", "model": eng.model_id,
                "content": [{"type": "text", "text": "".join(choices[0].text)}],
                "stop_reason": stop_reason(c), "stop_sequence": c.stop_sequence,
                "usage": usage(c, c.completion_tokens)}

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        body = await body_of(request)
        eng = await models.get(_model(body))
        return {"input_tokens": len(eng.encode_prompt(eng.template.render(conversation(body))))}


def _model(body: dict) -> str:
    m = body.get("model")
    if not isinstance(m, str):
        raise BadRequest("model: a string is required", param="model")
    return m
