"""The Anthropic Messages API (`/v1/messages`): translation onto the canonical chat request
(text, tool_use and tool_result blocks, tools, tool_choice, thinking) and from Chunks
(text, thinking and tool_use blocks), with the exact streaming event grammar. Images are
refused: the models served take text only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..errors import BadRequest, SuperfluidError
from ..ids import new_id
from ..request import Chunk, FinishReason, GenRequest, SamplingParams
from ..engine import for_api
from .anthropic_request import cache_hint, conversation, dropped_tools, tools_of
from .schema import number_in
from .prompt import chat_prompt as build_chat_prompt
from .prompt import response_format_grammar, template_options
from . import resume
from .blocks import Blocks
from .hosted import notice
from .sse import cursor, frame, tagged
from .runner import Run

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 503: "overloaded_error"}


def error_response(e: SuperfluidError) -> Response:
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}
    return Response(orjson.dumps(body), status_code=e.status, media_type="application/json")


# Anthropic's defaults; what it has no parameter for takes the engine's defaults or SamplingParams's
DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def gen_request(body: dict, prompt: list[int], seed: int, qos, grammar: str = "",
                channels=None, cache: tuple[int, float] | None = None, defaults: dict | None = None) -> GenRequest:
    """`defaults`: the engine's sampling defaults (operator and model), over Anthropic's."""
    d = for_api(DEFAULTS, defaults or {})
    mt = body.get("max_tokens")
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise BadRequest("max_tokens: a positive integer is required", param="max_tokens")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest("stop_sequences must be a list of strings", param="stop_sequences")
    top_k = body.get("top_k", int(d["top_k"]))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise BadRequest("top_k must be a non-negative integer", param="top_k")
    sp = SamplingParams(**{**d, "temperature": number_in(body, "temperature", 0, 1, d["temperature"]),
                           "top_p": number_in(body, "top_p", 0.001, 1, d["top_p"]), "top_k": top_k},
                        seed=seed, grammar=grammar)
    return GenRequest(new_id("msg"), prompt, sp, mt, tuple(stops), qos, channels=channels, cache=cache)


# thinking.type: enabled / disabled turn the template's reasoning on or off; adaptive (the
# model decides, Claude Code's default) leaves the template's own default
THINKING = {"enabled": True, "disabled": False, "adaptive": None}


def chat_prompt(eng, body: dict):
    """The canonical prompt. Accepted and ignored, as Anthropic's API ignores what a model does
    not use: metadata, context_management (this server keeps no thinking to clear),
    output_config.effort (the template's reasoning_effort where it has one), the beta
    headers and `?beta=true`, cache_control (cache_hint reads it)."""
    tools, choice = tools_of(body)
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if thinking is not None and kind not in THINKING:
        raise BadRequest("thinking.type must be enabled, disabled or adaptive", param="thinking.type")
    oc = body.get("output_config")
    effort = oc.get("effort") if isinstance(oc, dict) else None
    fmt = oc.get("format") if isinstance(oc, dict) else None
    grammar = response_format_grammar(fmt, "output_config.format") if fmt is not None else ""
    conv = conversation(body)
    return build_chat_prompt(eng, conv, tools=tools, tool_choice=choice, grammar=grammar,
                             parallel_tool_calls=not _no_parallel(body.get("tool_choice")),
                             template_kwargs=template_options(enable_thinking=THINKING.get(kind or ""),
                                                              reasoning_effort=effort),
                             continue_final=prefilled(body, conv))


def prefilled(body: dict, conv: list[dict]) -> bool:
    """A final assistant message is the start of the reply, which continues from its text
    (Anthropic's prefill); as there, that text may not end with whitespace."""
    msgs = body["messages"]
    last = conv[-1]
    if msgs[-1].get("role") != "assistant" or last.get("role") != "assistant" or last.get("tool_calls"):
        return False
    text = last.get("content") or ""
    if text != text.rstrip():
        raise BadRequest("messages: final assistant content cannot end with trailing whitespace",
                         param=f"messages.{len(msgs) - 1}.content")
    return True


def _no_parallel(choice: object) -> bool:
    return isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True


def stop_reason(c: Chunk, made_calls: bool = False) -> str:
    if c.finish == FinishReason.STOP_SEQUENCE:
        return "stop_sequence"
    if c.finish == FinishReason.LENGTH:
        return "max_tokens"
    return "tool_use" if made_calls else "end_turn"


def tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def tool_use_block(call) -> dict:
    try:
        args = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        args = {}
    return {"type": "tool_use", "id": tool_id(call.id), "name": call.name, "input": args}


def usage(c: Chunk, output_tokens: int, marked: int = 0) -> dict:
    """Anthropic's split of the prompt: read from cache (reused KV, restored included), written
    to it (the marked prefix this request computed), and the rest; the three sum to the prompt.
    The rest is at least the prompt's last token (always computed: its logits start the
    answer): a client adds message_delta's counts to message_start's, and Claude Code keeps
    message_start's input_tokens (the whole prompt) when the delta's is 0, which counted the
    prompt twice and made it stop with "Prompt is too long"."""
    last = max(0, c.prompt_tokens - 1)
    read = min(c.cached_tokens, last)
    created = max(0, min(marked, last) - read)
    return {"input_tokens": c.prompt_tokens - read - created, "output_tokens": output_tokens,
            "cache_read_input_tokens": read, "cache_creation_input_tokens": created}


def _sse(event: str, data: dict) -> bytes:
    return frame(data, event)


PING = _sse("ping", {"type": "ping"})  # Anthropic's keepalive event (api/streams.sse sends it when idle)


class _Events:
    """Anthropic's content blocks (api/blocks.py): thinking, text and tool_use, whose input
    streams as input_json_delta fragments."""

    def open(self, index: int, kind: str, call) -> list[bytes]:
        block = ({"type": "thinking", "thinking": "", "signature": ""} if kind == "reasoning" else
                 {"type": "text", "text": ""} if kind == "text" else
                 {"type": "tool_use", "id": tool_id(call.id), "name": call.name, "input": {}})
        return [_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})]

    def add(self, index: int, kind: str, piece: str) -> list[bytes]:
        delta = ({"type": "thinking_delta", "thinking": piece} if kind == "reasoning" else
                 {"type": "text_delta", "text": piece} if kind == "text" else
                 {"type": "input_json_delta", "partial_json": piece})
        return [_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})]

    def close(self, index: int, kind: str) -> list[bytes]:
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": index})]


async def events(rid: str, model: str, prompt_tokens: int, stream, session: str | None = None,
                 marked: int = 0) -> AsyncIterator[bytes]:
    """A Messages stream from typed output chunks, live or replayed from the log."""
    start: dict = {"id": rid, "type": "message", "role": "assistant", "model": model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
    yield _sse("message_start", {"type": "message_start", "message": start})
    yield PING
    blocks = Blocks(_Events())
    async for c in stream:
        out = blocks.feed(c)
        if c.finish is not None:
            if c.error is not None:
                err = c.error
                out.append(_sse("error", {"type": "error", "error": {
                    "type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message}}))
                for o in tagged(out, cursor(session, c.event_id)):
                    yield o
                return
            if blocks.index < 0:  # nothing was said: one empty text block, as Anthropic sends
                out += blocks.text() + _Events().add(0, "text", "")
            out += blocks.close()
            out.append(_sse("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": stop_reason(c, blocks.calls > 0),
                                                        "stop_sequence": c.stop_sequence},
                                              "usage": usage(c, c.completion_tokens, marked)}))
            out.append(_sse("message_stop", {"type": "message_stop"}))
        for o in tagged(out, cursor(session, c.event_id)):
            yield o
        if c.finish is not None:
            return


resume.register("anthropic.messages", lambda sid, p, chunks: events(
    str(p.get("response_id") or sid), str(p.get("model") or ""), int(p.get("prompt_tokens") or 0), chunks, sid,
    int(p.get("marked") or 0)))


def add_routes(app: FastAPI, models, qos_for, body_of) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request, response: Response):
        body = await body_of(request)
        dropped = notice("/v1/messages", dropped_tools(body))
        eng = await models.get(_model(body))
        cp = await asyncio.to_thread(chat_prompt, eng, body)  # off the event loop
        hint = cache_hint(body, cp)
        req = gen_request(body, cp.prompt, eng.new_seed(), qos_for(request), cp.grammar, cp.channels,
                          hint, eng.sampling_defaults)
        marked = hint[0] if hint else 0
        response.headers.update(dropped)  # before the submit: nothing after it may fail the request
        run = await Run.submit(request, models.service, eng, [req], cp.bodies, api="anthropic.messages",
                               params={"response_id": req.id, "marked": marked})
        if body.get("stream"):
            out = run.stream(events(req.id, eng.model_id, len(cp.prompt), run.streams[0], req.session, marked),
                             keepalive=PING)
            out.headers.update(dropped)
            return out
        ch = (await run.collect())[0]
        c = ch.last
        assert c is not None  # collect() returns only finished choices
        content: list[dict] = []
        reasoning = "".join(ch.reasoning)
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        text = "".join(ch.text)
        if text or not ch.tool_calls:
            content.append({"type": "text", "text": text})
        content += [tool_use_block(t) for t in ch.tool_calls]
        return {"id": req.id, "type": "message", "role": "assistant", "model": eng.model_id, "content": content,
                "stop_reason": stop_reason(c, bool(ch.tool_calls)), "stop_sequence": c.stop_sequence,
                "usage": usage(c, c.completion_tokens, marked)}

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        body = await body_of(request)
        eng = await models.get(_model(body))
        return {"input_tokens": len((await asyncio.to_thread(chat_prompt, eng, body)).prompt)}


def _model(body: dict) -> str | None:
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise BadRequest("model must be a string", param="model")
    return m  # None: the default model
