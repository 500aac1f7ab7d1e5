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
from ..sampling_defaults import for_api
from .schema import number_in
from .prompt import chat_prompt as build_chat_prompt
from .prompt import response_format_grammar, template_options
from . import resume
from .policy import owner_of
from .blocks import Blocks
from .hosted import notice
from .sse import cursor, frame, tagged
from .streams import access_record, collect, raise_first_error, sse

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 503: "overloaded_error"}


def error_response(e: SuperfluidError) -> Response:
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}
    return Response(orjson.dumps(body), status_code=e.status, media_type="application/json")


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
        else:
            raise BadRequest(f"unexpected content block {kind!r}", param=f"{where}.{i}")
    return "".join(out)


# `system` inside messages: Claude Code sends its later instructions there (the
# mid-conversation-system beta); they stay where they are, so the prompt before them is
# the previous turn's prompt and its cache still holds.
ROLES = ("user", "assistant", "system")


def _blocks(m: dict, i: int) -> list[dict]:
    """One Anthropic message as canonical messages: text, assistant tool calls (tool_use),
    tool results (tool_result, each a `tool` message). Thinking blocks are not fed back."""
    content = m.get("content", "")
    where = f"messages.{i}.content"
    if m["role"] == "system":
        return [{"role": "system", "content": _text(content, where)}]
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content blocks", param=where)
    text: list[str] = []
    calls: list[dict] = []
    results: list[dict] = []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        elif kind == "tool_use" and m["role"] == "assistant":
            if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                raise BadRequest("tool_use needs a name and an input object", param=f"{where}.{j}")
            calls.append({"id": str(b.get("id") or ""), "type": "function", "function": {
                "name": b["name"], "arguments": orjson.dumps(b.get("input", {})).decode()}})
        elif kind == "tool_result" and m["role"] == "user":
            inner = b.get("content", "")
            body = inner if isinstance(inner, str) else _text(inner, f"{where}.{j}.content")
            if b.get("is_error"):
                body = "Error: " + body
            results.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id") or ""), "content": body})
        elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
            continue
        elif kind == "image":
            raise BadRequest("this model takes text only: image blocks are not supported", param=f"{where}.{j}")
        else:
            raise BadRequest(f"unexpected content block {kind!r} in a {m['role']} message", param=f"{where}.{j}")
    out: list[dict] = results[:]
    if calls:
        out.append({"role": "assistant", "content": "".join(text) or None, "tool_calls": calls})
    elif text or not results:
        out.append({"role": m["role"], "content": "".join(text)})
    return out


def conversation(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: a non-empty list is required", param="messages")
    turns = []
    if body.get("system") is not None:
        turns.append({"role": "system", "content": _text(body["system"], "system")})
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest("each message needs role 'user', 'assistant' or 'system'", param=f"messages.{i}.role")
        turns += _blocks(m, i)
    return turns


TTLS = {"5m": 300.0, "1h": 3600.0}
MAX_BREAKPOINTS = 4


def _ttl(block, where: str) -> float | None:
    """A block's cache_control TTL in seconds (None: the block has none)."""
    cc = block.get("cache_control") if isinstance(block, dict) else None
    if cc is None:
        return None
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise BadRequest("cache_control must be {\"type\": \"ephemeral\"} with an optional ttl",
                         param=f"{where}.cache_control")
    ttl = cc.get("ttl", "5m")
    if ttl not in TTLS:
        raise BadRequest("cache_control.ttl must be \"5m\" or \"1h\"", param=f"{where}.cache_control.ttl")
    return TTLS[ttl]


def cache_breakpoints(body: dict) -> list[tuple[int, float]]:
    """(message, ttl seconds) for each cache_control breakpoint: the index, in conversation()'s
    messages, of the message that holds the marked block (-1 for tools and system: the first
    message rendered, which holds them). A breakpoint marks the prompt through the end of
    that message."""
    marks: list[tuple[int, float]] = []
    for where, blocks in (("tools", body.get("tools")), ("system", body.get("system"))):
        for j, b in enumerate(blocks if isinstance(blocks, list) else []):
            ttl = _ttl(b, f"{where}.{j}")
            if ttl is not None:
                marks.append((-1, ttl))
    n = 0 if body.get("system") is None else 1
    for i, m in enumerate(body.get("messages") or []):
        count = len(_blocks(m, i))
        results = 0  # tool results come first, one message each; the rest is the last message
        for j, b in enumerate(m["content"] if isinstance(m.get("content"), list) else []):
            ttl = _ttl(b, f"messages.{i}.content.{j}")
            is_result = b.get("type") == "tool_result"
            if ttl is not None:
                marks.append((n + results if is_result else n + count - 1, ttl))
            results += is_result
        n += count
    if len(marks) > MAX_BREAKPOINTS:
        raise BadRequest(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                         f"Found {len(marks)}.", param="cache_control")
    return marks


def cache_hint(body: dict, cp) -> tuple[int, float] | None:
    """(prompt tokens, seconds) to keep warm: the longest marked prefix, for the longest TTL
    asked (it holds every shorter marked prefix)."""
    marks = cache_breakpoints(body)
    if not marks:
        return None
    last = max(i for i, _ in marks)
    # the bodies are the rendered messages, then the opener; tools may have added a system message
    last = 0 if last < 0 else last + len(cp.bodies) - 1 - len(conversation(body))
    return sum(len(b.span) for b in cp.bodies[:last + 1]), max(t for _, t in marks)


# Anthropic's server tools run on Anthropic's side: this server has no web search or sandbox,
# so they are left out of the prompt (api/hosted.py says so to the client).
SERVER_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "mcp_toolset", "tool_search_tool_")


def hosted(tool: dict) -> bool:
    kind = tool.get("type")
    return isinstance(kind, str) and kind.startswith(SERVER_TOOLS)


def dropped_tools(body: dict) -> list[str]:
    """The types of the server tools a request offered, which the model is not given."""
    tools = body.get("tools")
    return [str(t.get("type")) for t in tools if isinstance(t, dict) and hosted(t)] if isinstance(tools, list) else []


def tools_of(body: dict) -> tuple[list[dict] | None, object]:
    """Anthropic tools and tool_choice in OpenAI's shapes (server tools left out)."""
    tools = body.get("tools")
    if tools is None:
        return None, None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise BadRequest("each tool needs a name and an input_schema", param=f"tools.{i}")
        if hosted(t):
            continue
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                      "parameters": t.get("input_schema") or {"type": "object"}}})
    choice = body.get("tool_choice")
    if choice is None:
        return out, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if kind == "tool":
        named = next((t for t in tools if isinstance(t, dict) and t.get("name") == choice.get("name")), None)
        if named is not None and hosted(named):
            raise BadRequest(f"tool_choice names {named['name']!r}, a server tool ({named.get('type')}) this server "
                             "cannot run", param="tool_choice")
        return out, {"type": "function", "function": {"name": choice.get("name")}}
    if mapped is None:
        raise BadRequest("tool_choice type must be auto, any, tool or none", param="tool_choice")
    return out, mapped


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
    return build_chat_prompt(eng, conversation(body), tools=tools, tool_choice=choice, grammar=grammar,
                             parallel_tool_calls=not _no_parallel(body.get("tool_choice")),
                             template_kwargs=template_options(enable_thinking=THINKING.get(kind or ""),
                                                              reasoning_effort=effort))


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
        streams = await models.service.submit(eng, [req], cp.bodies, api="anthropic.messages",
                                              params={"response_id": req.id, "marked": marked}, owner=owner_of(request),
                                              access=access_record(request))
        response.headers.update(dropped)
        if body.get("stream"):
            out = sse(events(req.id, eng.model_id, len(cp.prompt), streams[0], req.session, marked),
                      models.service.on_close(eng, [req]), [req], keepalive=PING)
            out.headers.update(dropped)
            return out
        choices = await collect(request, streams)
        raise_first_error(choices)
        ch = choices[0]
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
