"""What coding agents really send, in the shapes that made their first request fail (issue 31),
against the shared daemon: Codex's `namespace` and hosted tools on /v1/responses, Claude
Code's `system` messages inside `messages` and its thinking types on /v1/messages (the rest of
its fields: tests/app/test_agent_fields.py). The agents themselves run in test_agents.py."""

import httpx
import pytest

from .conftest import MODEL
from .daemon import Daemon


@pytest.fixture(scope="module")
def daemon():
    """A daemon of this module's own (1024-token window): the session daemon's prefix cache
    stays as the tests that compare its greedy text with other engines' expect it (issue 37:
    greedy output can still depend on what was cached, and how)."""
    d = Daemon()
    yield d
    d.stop()


def test_responses_accepts_codex_tools_and_fields(daemon):
    body = {"model": MODEL, "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are terse."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
        "tools": [{"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
                  {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.",
                   "tools": [{"type": "function", "name": "spawn_agent", "description": "Spawn one.", "strict": False,
                              "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]},
                  {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k-1", "client_metadata": {"a": "b"},
        "max_output_tokens": 8}
    r = httpx.post(daemon.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["x-superfluid-dropped-tools"] == "web_search"
    out = r.json()
    assert out["parallel_tool_calls"] is True and out["status"] in ("completed", "incomplete")


def test_responses_forced_namespace_call_comes_back_with_its_namespace(daemon):
    """A call to a namespace's function is answered as {name, namespace}, as Codex dispatches it,
    and read back the same way in the next request's input."""
    tools = [{"type": "namespace", "name": "multi_agent_v1", "description": "Agents.",
              "tools": [{"type": "function", "name": "wait_agent", "description": "Wait.",
                         "parameters": {"type": "object", "properties": {"id": {"type": "integer"}},
                                        "required": ["id"], "additionalProperties": False}}]}]
    body = {"model": MODEL, "input": "Wait for agent 1.", "tools": tools, "max_output_tokens": 40,
            "tool_choice": {"type": "function", "name": "wait_agent"}, "parallel_tool_calls": False}
    r = httpx.post(daemon.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    call = next(o for o in r.json()["output"] if o["type"] == "function_call")
    assert (call["name"], call["namespace"]) == ("wait_agent", "multi_agent_v1")
    back = {"model": MODEL, "tools": tools, "max_output_tokens": 4, "input": [
        {"type": "message", "role": "user", "content": "Wait for agent 1."},
        {"type": "function_call", "name": "wait_agent", "namespace": "multi_agent_v1", "call_id": call["call_id"],
         "arguments": call["arguments"]},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "agent 1 finished"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"}]}
    r = httpx.post(daemon.url + "/v1/responses", json=back, timeout=120)
    assert r.status_code == 200, r.text


def test_responses_tool_choice_naming_a_hosted_tool_is_refused(daemon):
    body = {"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}
    r = httpx.post(daemon.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text


def test_messages_system_message_stays_in_place(daemon):
    """A system message inside `messages` keeps its place: the prompt before it is the prompt
    of the turn before, so the prefix cache still holds it."""
    def count(msgs):
        r = httpx.post(daemon.url + "/v1/messages/count_tokens",
                       json={"model": MODEL, "max_tokens": 8, "messages": msgs}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]
    user = {"role": "user", "content": "Say hi."}
    assert count([user, {"role": "system", "content": "Be brief."}]) > count([user])


def test_messages_thinking_type_is_checked(daemon):
    body = {"model": MODEL, "max_tokens": 4, "thinking": {"type": "sometimes"},
            "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(daemon.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400 and "thinking" in r.json()["error"]["message"]


def test_head_root_answers(daemon):
    """Claude Code's first request is HEAD /: a 2xx, as GET / is."""
    assert httpx.head(daemon.url + "/", timeout=10).status_code == 200


@pytest.mark.parametrize("path,extra", [("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
                                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                                  "max_tokens": 2})])
def test_prompt_cache_key_is_a_cache_hint_and_checked(daemon, path, extra):
    """prompt_cache_key (Codex sends one per conversation) keeps the prompt warm for the next
    turn (api/prompt.prompt_cache_hint); a key that is not a bounded string is a 400 naming it."""
    ok = httpx.post(daemon.url + path, json={"model": MODEL, **extra, "prompt_cache_key": "conv-1",
                                              "prompt_cache_retention": "24h"}, timeout=60)
    assert ok.status_code == 200, ok.text
    for key, retention in ((["list"], None), ("k" * 1025, None), ("conv-1", "forever")):
        bad = httpx.post(daemon.url + path, json={"model": MODEL, **extra, "prompt_cache_key": key,
                                                   "prompt_cache_retention": retention}, timeout=60)
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] in ("prompt_cache_key", "prompt_cache_retention")
