"""Deeply nested JSON where no depth was bounded (issue 54, low): a prompt wrapped in lists on
llama-server's `/completion`, and a tool call's arguments sent back in a conversation, on every
API that takes them. Each was a recursion error, an untyped 500 (orjson.dumps stops at 255
levels, json.dumps and the prompt's unwrapping at Python's recursion limit), and arguments as
JSON text went unbounded into templates that parse them; each is now a typed 400 naming the
limit and the parameter, in one process (tests/harness.py) on a window wide enough that the
template renders them."""

from __future__ import annotations

import json

import httpx
import pytest

from superfluid.limits import MAX_ARGS_DEPTH, MAX_PROMPT_WRAPS

from ..fakes import FakeModel
from ..harness import MODEL, run

DEPTHS = (300, 1000)  # past orjson's 254 levels; past Python's recursion limit (under orjson's 1,024)


DEEP = "@DEEP@"  # where the deep JSON text is spliced in (json.dumps of it would recurse)


def obj(n: int) -> str:
    return '{"a":' * n + "1" + "}" * n


def splice(body: dict, n: int, text: bool = False) -> str:
    deep = obj(n)
    return json.dumps(body).replace(f'"{DEEP}"', json.dumps(deep) if text else deep)


def call(args: object) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}


HI = {"role": "user", "content": "hi"}


def chat(n: int, text: bool = False) -> str:
    msgs = [HI, {"role": "assistant", "content": None, "tool_calls": [call(DEEP)]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    return splice({"model": MODEL, "max_tokens": 2, "messages": msgs}, n, text)


def chat_text(n: int) -> str:
    return chat(n, text=True)


def anthropic(n: int) -> str:
    msgs = [HI, {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f", "input": DEEP}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "ok"}]}]
    return splice({"model": MODEL, "max_tokens": 2, "messages": msgs}, n)


def responses(n: int) -> str:
    items = [HI, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": DEEP},
             {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    return splice({"model": MODEL, "max_output_tokens": 2, "input": items}, n, text=True)


def ollama(n: int) -> str:
    msgs = [HI, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": DEEP}}]},
            {"role": "tool", "content": "ok"}]
    return splice({"model": MODEL, "stream": False, "options": {"num_predict": 2}, "messages": msgs}, n)


def completion(n: int) -> str:
    return json.dumps({"prompt": DEEP, "n_predict": 2}).replace(f'"{DEEP}"', "[" * n + '"hi"' + "]" * n)


CASES = {  # route, body, the parameter the 400 names, the limit its message names
    "chat, arguments as an object": ("/v1/chat/completions", chat, "messages.1.tool_calls", MAX_ARGS_DEPTH),
    "chat, arguments as JSON text": ("/v1/chat/completions", chat_text, "messages.1.tool_calls", MAX_ARGS_DEPTH),
    "anthropic, tool_use input": ("/v1/messages", anthropic, None, MAX_ARGS_DEPTH),
    "responses, function_call arguments": ("/v1/responses", responses, "messages.1.tool_calls.0.function.arguments",
                                           MAX_ARGS_DEPTH),
    "ollama, tool_calls arguments": ("/api/chat", ollama, None, MAX_ARGS_DEPTH),
    "/completion, a wrapped prompt": ("/completion", completion, "prompt", MAX_PROMPT_WRAPS),
}


@pytest.mark.parametrize("n", DEPTHS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_deep_body_is_a_typed_400_naming_the_limit(case, n):
    path, make, param, limit = CASES[case]

    async def body(h):
        try:
            r = await h.client.post(path, content=make(n), headers={"content-type": "application/json"})
        except (RecursionError, TypeError) as e:  # out of the app: a 500 on a real server
            pytest.fail(f"{path} raised {e!r}")
        ok = await h.client.post(path, content=make(3), headers={"content-type": "application/json"})
        return r, ok
    r, ok = run(body, FakeModel(n_ctx=16384))
    assert r.status_code == 400, r.text
    text = r.text
    assert f"deeper than {limit} levels" in text, text
    if param is not None:
        assert r.json()["error"]["param"].startswith(param), text
    assert ok.status_code == 200, ok.text  # shallow ones still answer


def test_the_native_session_api_bounds_arguments_too():
    async def body(h):
        s = await h.client.post("/v1/sessions", json={"model": MODEL})
        sid = s.json()["id"]
        raw = splice({"role": "assistant", "content": "", "tool_calls": [call(DEEP)]}, 300)
        try:
            return await h.client.post(f"/v1/sessions/{sid}/messages", content=raw,
                                       headers={"content-type": "application/json"})
        except (RecursionError, TypeError) as e:
            pytest.fail(f"raised {e!r}")
    r: httpx.Response = run(body)
    assert r.status_code == 400 and f"deeper than {MAX_ARGS_DEPTH} levels" in r.text, r.text
