"""The OpenAI Responses API (`/v1/responses`): `input` as a string or items (messages,
function_call, function_call_output), `instructions`, `previous_response_id` chains,
function `tools` and `tool_choice`, `text.format` (text / json_object / json_schema),
`store` (stored responses live in the session store, beside the request's session, and
survive a restart), streaming with the documented event sequence and `sequence_number`s,
`metadata`, `seed`, `background` (api/response_background.py: poll, cancel, stream from a
sequence number), GET / DELETE / input_items (paged). The stream's event builder is
api/response_events.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request, Response

from ..errors import BadRequest
from ..ids import new_id
from ..limits import check_metadata
from ..request import FinishReason, GenRequest, SamplingParams
from ..engine import for_api
from . import resume
from .cache_ns import salt_of
from .prompt import chat_prompt, prompt_cache_hint, response_format_grammar, template_options
from .response_background import Background, starting_after
from .response_store import ResponseStore
from .hosted import notice
from .response_events import SEP, events, namespaces, output_items
from .schema import number_in
from .runner import Run
from .streams import sse


def _text_of(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of parts", param=where)
    out = []
    for i, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            out.append(p["text"])
        elif kind in ("input_image", "input_file"):
            raise BadRequest("this model takes text only", param=f"{where}.{i}")
        else:
            raise BadRequest(f"unsupported content part {kind!r}", param=f"{where}.{i}")
    return "".join(out)


def input_items(inp) -> list[dict]:
    """Normalize `input` to items: messages {type, role, content: [{type, text}]},
    function_call {call_id, name, arguments} and function_call_output {call_id, output}."""
    if isinstance(inp, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": inp}]}]
    if not isinstance(inp, list) or not inp:
        raise BadRequest("input must be a string or a non-empty list of items", param="input")
    items: list[dict] = []
    for i, it in enumerate(inp):
        kind = it.get("type", "message") if isinstance(it, dict) else type(it).__name__
        if kind == "function_call":
            if not isinstance(it.get("name"), str) or not isinstance(it.get("arguments", ""), str):
                raise BadRequest("a function_call needs name and arguments (a JSON string)", param=f"input.{i}")
            ns = it.get("namespace")
            items.append({"type": "function_call", "call_id": str(it.get("call_id") or ""),
                          "name": f"{ns}{SEP}{it['name']}" if isinstance(ns, str) and ns else it["name"],
                          "arguments": it.get("arguments", "")})
            continue
        if kind == "function_call_output":
            out = it.get("output", "")
            items.append({"type": "function_call_output", "call_id": str(it.get("call_id") or ""),
                          "output": out if isinstance(out, str) else _text_of(out, f"input.{i}.output")})
            continue
        if kind == "reasoning" or kind in HOSTED_ITEMS:
            continue  # earlier reasoning is not fed back; nor are hosted tools' calls, never made here
        if kind != "message":
            raise BadRequest(f"input item type {kind!r} is not supported", param=f"input.{i}")
        role = it.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest("role must be user, assistant, system or developer", param=f"input.{i}.role")
        text = _text_of(it.get("content", ""), f"input.{i}.content")
        part = "output_text" if role == "assistant" else "input_text"
        items.append({"type": "message", "role": role, "content": [{"type": part, "text": text}]})
    return items


def turns(items: list[dict]) -> list[dict]:
    """Items as canonical chat messages: function calls join the assistant turn before
    them, outputs become tool messages."""
    msgs: list[dict] = []
    for it in items:
        if it["type"] == "message":
            msgs.append({"role": "system" if it["role"] == "developer" else it["role"],
                         "content": "".join(p["text"] for p in it["content"])})
        elif it["type"] == "function_call":
            call = {"id": it["call_id"], "type": "function", "function": {"name": it["name"],
                                                                          "arguments": it["arguments"] or "{}"}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif it["type"] == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]})
    return msgs


# input items of tools that run on OpenAI's side: a conversation carried over from there may
# hold them; this server never makes them, and they are not fed back
HOSTED_ITEMS = frozenset({"web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call",
                          "computer_call", "computer_call_output", "mcp_list_tools", "mcp_call",
                          "mcp_approval_request", "mcp_approval_response", "tool_search_call", "tool_search_output",
                          "local_shell_call", "local_shell_call_output"})


def _function(t: dict, where: str, prefix: str = "") -> dict:
    if not isinstance(t.get("name"), str) or not t["name"]:
        raise BadRequest("a function tool needs a name", param=where)
    return {"type": "function", "function": {"name": prefix + t["name"], "description": t.get("description") or "",
                                             "parameters": t.get("parameters") or {"type": "object"}}}


def tools_of(body: dict) -> tuple[list[dict] | None, object, list[str]]:
    """(function tools in OpenAI's chat shape, tool_choice, the types of the tools left out).
    A `namespace` tool's functions are offered as NAMESPACE__NAME (response_events.split_name
    reads the calls back); tools that run on the provider's side (web_search, file_search ...)
    and freeform `custom` tools are left out (api/hosted.py), unless tool_choice names one."""
    tools = body.get("tools")
    if not tools:
        return None, None, []
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out: list[dict] = []
    dropped: list[str] = []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if not isinstance(kind, str):
            raise BadRequest("each tool needs a type", param=f"tools.{i}")
        if kind == "function":
            out.append(_function(t, f"tools.{i}"))
        elif kind == "namespace":
            inner = t.get("tools")
            if not isinstance(t.get("name"), str) or not t["name"] or not isinstance(inner, list):
                raise BadRequest("a namespace tool needs a name and a list of tools", param=f"tools.{i}")
            for j, f in enumerate(inner):
                if isinstance(f, dict) and f.get("type", "function") == "function":
                    out.append(_function(f, f"tools.{i}.tools.{j}", t["name"] + SEP))
                else:
                    dropped.append(f"{t['name']}.{f.get('type') if isinstance(f, dict) else '?'}")
        else:
            dropped.append(kind)
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function":
            choice = {"type": "function", "function": {"name": _qualified(choice, out)}}
        elif kind not in ("allowed_tools",):
            raise BadRequest(f"tool_choice names a {kind!r} tool, which runs on the provider's side; this server "
                             "cannot run it", param="tool_choice")
        else:
            choice = choice.get("mode", "auto")
    return out or None, choice, dropped


def _qualified(choice: dict, tools: list[dict]) -> object:
    """The offered name of the function tool_choice names (NAMESPACE__NAME for a namespace's)."""
    name, ns = choice.get("name"), choice.get("namespace")
    if isinstance(ns, str) and ns:
        return f"{ns}{SEP}{name}"
    names = [t["function"]["name"] for t in tools]
    if name in names:
        return name
    inner = [n for n in names if n.partition(SEP)[2] == name]
    return inner[0] if len(inner) == 1 else name


async def record_of(store: ResponseStore, previous: str | None, new_items: list[dict]) -> dict:
    """What a stored response keeps beside it: the conversation it answered and its input."""
    history: list[dict] = []
    if previous:
        prev = await store.get(previous)
        history = prev["conversation"] + [o for o in prev["response"]["output"]
                                          if o["type"] in ("message", "function_call")]
    return {"conversation": history + new_items, "input_items": new_items}


def _status(finish) -> str:
    if finish == FinishReason.LENGTH:
        return "incomplete"
    return "cancelled" if finish in (FinishReason.CANCELLED, FinishReason.DROPPED) else "completed"


async def finish(store: ResponseStore | None, base: dict, record: dict, session: str | None, text: str,
                 reasoning: str, calls: list, c) -> dict:
    """The finished response, stored unless the request said store: false (or `store` is
    None: a background response's replay, whose task stores it)."""
    rid = base["id"]
    status = _status(c.finish)
    cut = status == "incomplete"
    resp = {**base, "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
            "output": output_items(rid, text, reasoning, calls, namespaces(base.get("tools"))),
            "usage": {"input_tokens": c.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": c.cached_tokens},
                      "output_tokens": c.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": c.prompt_tokens + c.completion_tokens}}
    if base["store"] and store is not None:
        await store.put({**record, "session": session, "response": resp}, session)
    return resp


def _replay(store: ResponseStore):
    def translate(sid: str, p: dict, chunks) -> AsyncIterator[bytes]:
        base = p["base"]

        async def finished(text: str, reasoning: str, calls: list, c) -> dict:
            if base.get("background"):  # its task stores it
                return await finish(None, base, {}, sid, text, reasoning, calls, c)
            record = await record_of(store, base.get("previous_response_id"), list(p.get("input_items") or []))
            return await finish(store, base, record, sid, text, reasoning, calls, c)
        return events(base, chunks, finished, sid)
    return translate


def add_routes(app: FastAPI, models, qos_for, body_of, store: ResponseStore) -> None:
    resume.register("responses", _replay(store))
    bg = Background(models.sessions, store)

    @app.post("/v1/responses")
    async def create(request: Request, response: Response):
        body = await body_of(request)
        previous = body.get("previous_response_id")
        if previous:
            await store.visible(str(previous), request)
        model = body.get("model")
        if model is None and previous:  # a continued conversation stays with its model
            model = (await store.get(str(previous)))["response"]["model"]
        if model is not None and not isinstance(model, str):  # None: the default model
            raise BadRequest("model must be a string", param="model")
        background, stored = body.get("background", False), body.get("store", True) is not False
        if not isinstance(background, bool) and background is not None:
            raise BadRequest("background must be a boolean", param="background")
        if background and not stored:
            raise BadRequest("a background response must be stored: background needs store: true", param="background")
        metadata = check_metadata(body.get("metadata"))
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise BadRequest("seed must be an integer", param="seed")
        text_opts = body.get("text") if isinstance(body.get("text"), dict) else {}
        grammar = response_format_grammar(text_opts.get("format"), "text.format")
        new_items = input_items(body.get("input"))
        record = await record_of(store, previous, new_items)
        conversation = record["conversation"]
        eng = await models.get(model)
        msgs = turns(conversation)
        if body.get("instructions"):
            msgs = [{"role": "system", "content": str(body["instructions"])}] + msgs
        tools, choice, dropped = tools_of(body)
        headers = notice("/v1/responses", dropped)
        parallel = body.get("parallel_tool_calls") is not False  # OpenAI's default: true
        effort = body.get("reasoning", {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
        cp = await asyncio.to_thread(  # rendering and tokenizing: off the event loop
            lambda: chat_prompt(eng, msgs, tools=tools, tool_choice=choice, grammar=grammar,
                                template_kwargs=template_options(reasoning_effort=effort),
                                parallel_tool_calls=parallel))
        room = max(1, eng.n_ctx - len(cp.prompt))  # the engine's check refuses what does not fit
        mt = body.get("max_output_tokens")
        if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
            raise BadRequest("max_output_tokens must be a positive integer", param="max_output_tokens")
        d = for_api({"temperature": 1.0, "top_p": 1.0}, eng.sampling_defaults)  # OpenAI's under the engine's
        sp = SamplingParams(**{**d, "temperature": number_in(body, "temperature", 0, 2, d["temperature"],
                                                             allow_null=True),
                               "top_p": number_in(body, "top_p", 0.001, 1, d["top_p"], allow_null=True)},
                            seed=eng.new_seed() if seed is None else seed % (1 << 63),
                            grammar=cp.grammar)
        salt = salt_of(body.get("cache_salt"))
        rid = "resp_" + new_id("r").split("-", 1)[1]
        req = GenRequest(rid, cp.prompt, sp, mt or room, (), qos_for(request), channels=cp.channels,
                         cache=prompt_cache_hint(body.get("prompt_cache_key"), body.get("prompt_cache_retention"),
                                                 len(cp.prompt)), persist=stored,
                         progress=body.get("return_progress") is True and body.get("stream") is True and not background)
        base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": eng.model_id,
                "instructions": body.get("instructions"), "previous_response_id": body.get("previous_response_id"),
                "max_output_tokens": mt, "temperature": sp.temperature, "top_p": sp.top_p,
                "store": stored, "background": bool(background), "tools": body.get("tools") or [],
                "tool_choice": body.get("tool_choice") or "auto", "parallel_tool_calls": parallel,
                "text": {"format": text_opts.get("format") or {"type": "text"}}, "metadata": metadata}
        response.headers.update(headers)  # before the submit: nothing after it may fail the request
        run = await Run.submit(request, models.service, eng, [req], cp.bodies, api="responses",
                               params={"response_id": rid, "base": base, "input_items": new_items,
                                       "store": base["store"]}, salt=salt)

        async def finished(text: str, reasoning: str, calls: list, c) -> dict:
            return await finish(store, base, record, req.session, text, reasoning, calls, c)

        if background:  # not tied to this connection: a task reads it; the stream reads the log
            pending = {**base, "output": [], "usage": None, "error": None, "incomplete_details": None}
            slots = request.scope.get("state", {}).get("slots")  # the key's max_concurrent counts it (guard.Slots)
            queued = await bg.start({**record, "session": req.session, "response": pending}, run.streams[0], finished,
                                    release=slots.hold() if slots is not None else None)
            run.take()  # its task reads it now (had the start failed, the generation would be cancelled)
            if body.get("stream"):
                return _with(sse(await bg.stream(rid, -1), lambda: None, [req]), headers)
            return queued
        if body.get("stream"):
            return _with(run.stream(events(base, run.streams[0], finished, req.session,
                                           with_timings=body.get("timings_per_token") is True)), headers)
        ch = (await run.collect())[0]
        return await finished("".join(ch.text), "".join(ch.reasoning), ch.tool_calls, ch.last)

    @app.get("/v1/responses/{rid}")
    async def retrieve(rid: str, request: Request):
        await store.visible(rid, request)
        if request.query_params.get("stream", "false").lower() == "true":
            after = starting_after(request.query_params.get("starting_after"))
            return sse(await bg.stream(rid, after), lambda: None, [])
        return (await bg.current(rid))["response"]

    @app.post("/v1/responses/{rid}/cancel")
    async def cancel(rid: str, request: Request):
        await store.visible(rid, request)
        return await bg.cancel(rid)

    @app.delete("/v1/responses/{rid}")
    async def delete(rid: str, request: Request):
        await store.visible(rid, request)
        if rid in bg.tasks:  # a running background response stops first, or its task would store it again
            await bg.cancel(rid)
        await store.delete(rid)
        return {"id": rid, "object": "response.deleted", "deleted": True}

    @app.get("/v1/responses/{rid}/input_items")
    async def items(rid: str, request: Request):
        await store.visible(rid, request)
        its = [{**it, "id": f"msg_{rid[5:]}_{i}", "status": "completed"}
               for i, it in enumerate((await store.get(rid))["input_items"])]
        return page(its, request.query_params)


def _with(resp, headers: dict[str, str]):
    resp.headers.update(headers)
    return resp


def page(items: list[dict], q) -> dict:
    """A page of a list, as OpenAI pages them: `order` (desc, the default, or asc), `after`
    (an item id: the page starts past it), `limit` (1 to 100, default 20)."""
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("order must be asc or desc", param="order")
    try:
        limit = int(q.get("limit", 20))
    except ValueError:
        raise BadRequest("limit must be an integer", param="limit") from None
    if not 1 <= limit <= 100:
        raise BadRequest("limit must be between 1 and 100", param="limit")
    if order == "desc":
        items = items[::-1]
    after = q.get("after")
    if after is not None:
        at = next((i for i, it in enumerate(items) if it["id"] == after), None)
        if at is None:
            raise BadRequest(f"no input item {after!r} in this response", param="after")
        items = items[at + 1:]
    data = items[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}
