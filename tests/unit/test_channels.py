"""Tool-call and reasoning parsing, pure: every format, streamed in every split."""

import json

import pytest

from superfluid.codec.channels import THINK, Channels, ChannelSpec
from superfluid.request import Calls
from superfluid.codec.dialects import GENERIC, HERMES, LLAMA3, MISTRAL, detect
from superfluid.codec.dialects.hermes import ToolStream
from superfluid.codec.tools import tool_list


def run(fmt, text, step=1, reasoning=None, start_in=False):
    """Feed text in pieces of `step` characters; return (content, reasoning, whole calls, cut)."""
    ch = Channels(ChannelSpec(fmt, reasoning, start_in))
    content, reason, calls = "", "", Calls()
    for i in range(0, len(text), step):
        p = ch.feed(text[i:i + step])
        content, reason = content + p.content, reason + p.reasoning
        calls.add(p.calls)
    p = ch.finish()
    calls.add(p.calls)
    return content + p.content, reason + p.reasoning, calls.done, ch.cut_call


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_hermes_calls_are_split_from_content(step):
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    content, _, calls, cut = run(HERMES, text, step)
    assert content == "Let me check.\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                  ("get_time", {})]
    assert not cut and len({c.id for c in calls}) == 2


def test_text_that_only_looks_like_a_marker_is_content():
    assert run(HERMES, "a < b and <tool", 1)[0] == "a < b and <tool"
    assert run(HERMES, "x <tool_calls> y", 2)[0] == "x <tool_calls> y"


def test_an_unparseable_call_falls_back_to_text_and_a_cut_one_is_dropped():
    content, _, calls, cut = run(GENERIC, "<tool_call>not json</tool_call> ok")
    assert calls == [] and content == "<tool_call>not json</tool_call> ok" and not cut
    content, _, calls, cut = run(GENERIC, 'hi <tool_call>{"name": "f", "argu')
    assert content == "hi " and calls == [] and cut


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_mistral_calls_run_to_the_end(step):
    text = 'Sure.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    content, _, calls, _ = run(MISTRAL, text, step)
    assert content == "Sure." and [c.name for c in calls] == ["a", "b"]
    assert run(MISTRAL, "[TOOL_CALLS] oops")[0] == "[TOOL_CALLS] oops"


def test_llama3_json_replies():
    content, _, calls, _ = run(LLAMA3, ' {"name": "get", "parameters": {"q": "x"}}', 4)
    assert content == "" and calls[0].name == "get" and json.loads(calls[0].arguments) == {"q": "x"}
    assert run(LLAMA3, "Hello {there}", 2)[0] == "Hello {there}"
    assert run(LLAMA3, '{"not": "a call"}', 3)[0] == '{"not": "a call"}'


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_reasoning_goes_to_its_channel(step):
    content, reason, _, _ = run(None, "<think>\nfirst, 2+2</think>\n\nIt is 4.", step, THINK)
    assert reason == "\nfirst, 2+2" and content == "It is 4."
    content, reason, _, _ = run(None, "plan it</think>done", step, THINK, start_in=True)
    assert reason == "plan it" and content == "done"
    content, reason, _, _ = run(None, "<think>never closed", step, THINK)
    assert reason == "never closed" and content == ""


def test_reasoning_then_a_call():
    content, reason, calls, _ = run(HERMES, '<think>need weather</think><tool_call>{"name": "w", "arguments": {}}'
                                    '</tool_call>', 2, THINK)
    assert reason == "need weather" and content == "" and calls[0].name == "w"


def test_format_detection():
    assert detect("{{ '<tool_call>' }}") is HERMES
    assert detect("[TOOL_CALLS] {{ x }}") is MISTRAL
    assert detect("<|python_tag|>") is LLAMA3
    assert detect("{{ '<|im_start|>' }}") is GENERIC


def test_rendering_for_a_template_without_tools():
    tools = tool_list([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    out, extra = GENERIC.render(msgs, tools)
    assert extra == {}
    assert out[0]["role"] == "system" and "<tools>" in out[0]["content"] and '"name": "f"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'}
    assert out[3] == {"role": "user", "content": "<tool_response>\n42\n</tool_response>"}
    out, extra = HERMES.render(msgs, tools)
    assert extra == {"tools": tools} and out[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_a_template_without_tools_gets_example_calls_built_from_the_schemas_alone():
    tools = tool_list([
        {"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"id": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["id", "n"]}}},
        {"type": "function", "function": {"name": "unit", "parameters": {
            "type": "object", "properties": {"u": {"type": "string", "enum": ["c", "f"]}}}}}])
    user = {"role": "user", "content": "What is the code of item 7?"}
    out, _ = GENERIC.render([{"role": "system", "content": "Be brief."}, user], tools)
    assert out[0]["content"].startswith("Be brief.\n\n") and out[-1] == user and len(out) == 8
    shots = out[1:7]
    assert [m["role"] for m in shots] == ["user", "assistant"] * 3
    calls = [json.loads(m["content"].removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
             for m in shots[1::2]]
    assert calls == [{"name": "lookup", "arguments": {"id": "a1", "n": 1}}, {"name": "unit", "arguments": {"u": "f"}},
                     {"name": "lookup", "arguments": {"id": "c333", "n": 333}}]
    # each request shows its call's values; none quotes the real question
    assert all(str(v) in ask["content"] for ask, c in zip(shots[::2], calls, strict=True)
               for v in c["arguments"].values())
    assert not any("item 7" in m["content"] for m in shots)
    # a conversation with calls of its own gets none, nor do templates that list the tools themselves
    called = [user, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": "7", "n": 7}'}}]}]
    assert len(GENERIC.render(called, tools)[0]) == 3
    assert len(GENERIC.render([*called, {"role": "tool", "tool_call_id": "c1", "content": "x"}], tools)[0]) == 4
    assert HERMES.render([user], tools)[0] == [user]
    assert GENERIC.render([user], [])[0] == [user]


def test_tool_stream_counts():
    s = ToolStream()
    s.feed('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert s.calls == 1
