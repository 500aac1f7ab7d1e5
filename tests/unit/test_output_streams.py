"""Typed output, pure: the output processor turns tokens into content, reasoning, tool-call
pieces and content logprobs; every API's stream translates the same chunks, and a stream
resumed at any cursor is exactly the rest of the live one."""

import asyncio
import json
import re

import pytest

from superfluid.api import resume, sse
from superfluid.api import anthropic, ollama, responses, streams  # noqa: F401 -- they register their translators
from superfluid.codec.channels import THINK, ChannelSpec
from superfluid.codec.detok import TextStream
from superfluid.codec.output import OutputProcessor
from superfluid.codec.dialects import GENERIC
from superfluid.request import CallDelta, Calls, Chunk, FinishReason, TokenLogprob

SID = "sess-test"


def _lp(t: int) -> TokenLogprob:
    return TokenLogprob(t, b"x", -0.5, ())


def test_processor_streams_a_call_and_keeps_logprobs_of_content_only():
    pieces = [b"Sure", b".", b"\n<tool", b"_call>", b'\n{"name": "lookup", ', b'"arguments": {"acc', b'ount": "a-1"',
              b"}}", b"\n</tool_call>", b"<", b"b> ok"]
    out = OutputProcessor(TextStream(pieces, frozenset({99})), ChannelSpec(GENERIC))
    got = [out.token(t, FinishReason.END_OF_TURN if t == 10 else None, _lp(t)) for t in range(11)]
    assert "".join(o.text for o in got) == "Sure.\n<b> ok"
    deltas = [d for o in got for d in o.calls]
    assert deltas[0] == CallDelta(0, deltas[0].id, "lookup") and deltas[0].id.startswith("call_")
    # the arguments came while the call was written, before its close marker
    assert [d.arguments for d in got[5].calls + got[6].calls if d.arguments] == ['{"acc', 'ount": "a-1"']
    assert "".join(d.arguments for d in deltas) == '{"account": "a-1"}' and deltas[-1].end and not deltas[-1].cut
    calls = Calls()
    calls.add(deltas)
    assert [(c.name, json.loads(c.arguments)) for c in calls.done] == [("lookup", {"account": "a-1"})]
    # logprobs: the content tokens' (the held "<" too, once it turned out to be content), never the markup's
    assert [lp.token for o in got for lp in o.logprobs] == [0, 1, 9, 10]


def test_a_cut_call_ends_cut_and_is_left_out_of_whole_calls():
    pieces = [b'<tool_call>{"name": "f", "arguments": {"a": 1']
    out = OutputProcessor(TextStream(pieces, frozenset()), ChannelSpec(GENERIC))
    o = out.token(0, FinishReason.LENGTH)
    assert o.text == "" and o.calls[-1].end and o.calls[-1].cut
    calls = Calls()
    calls.add(o.calls)
    assert calls.done == []


def test_reasoning_tokens_carry_no_logprobs():
    pieces = [b"<think>", b"hm", b"</think>", b"Yes"]
    out = OutputProcessor(TextStream(pieces, frozenset()), ChannelSpec(None, THINK))
    got = [out.token(t, FinishReason.END_OF_TURN if t == 3 else None, _lp(t)) for t in range(4)]
    assert "".join(o.reasoning for o in got) == "hm" and "".join(o.text for o in got) == "Yes"
    assert [lp.token for o in got for lp in o.logprobs] == [3]


def script() -> list[Chunk]:
    """A turn that reasons, says a little and calls a tool, as committed chunks."""
    parts = [dict(reasoning="Need"), dict(reasoning=" the code."), dict(text="Let me"), dict(text=" look."),
             dict(calls=[CallDelta(0, "call_1", "lookup")]), dict(calls=[CallDelta(0, arguments='{"account": ')]),
             dict(calls=[CallDelta(0, arguments='"a-1"}')]), dict(calls=[CallDelta(0, end=True)])]
    out = []
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        out.append(Chunk("r1", tokens=[i], event_id=10 + i, completion_tokens=i + 1, prompt_tokens=20,
                         finish=FinishReason.END_OF_TURN if last else None, **p))
    return out


def text_script() -> list[Chunk]:
    words = ["Once", " upon", " a", " time"]
    return [Chunk("r1", text=w, tokens=[i], event_id=5 + i, completion_tokens=i + 1, prompt_tokens=7,
                  logprobs=[TokenLogprob(i, w.encode(), -0.25 * i, ((i, w.encode(), -0.25 * i),))],
                  finish=FinishReason.LENGTH if i == len(words) - 1 else None) for i, w in enumerate(words)]


async def _source(chunks):
    for c in chunks:
        yield c


async def _collect(gen) -> list[bytes]:
    return [b async for b in gen]


class _NoStore:
    async def put(self, record, session):
        raise AssertionError("store: false must not store")


PARAMS = {
    "chat.completions": {"response_id": "chatcmpl-1", "model": "m", "created": 1700000000, "index": 0,
                         "logprobs": True, "include_usage": True},
    "completions": {"response_id": "cmpl-1", "model": "m", "created": 1700000000, "index": 0, "logprobs": True},
    "anthropic.messages": {"response_id": "msg-1", "model": "m", "prompt_tokens": 20},
    "responses": {"base": {"id": "resp_1234", "object": "response", "created_at": 1700000000, "model": "m",
                           "store": False}, "input_items": []},
}


def _translator(api: str):
    if api == "responses":
        return responses._replay(_NoStore())
    return resume._TRANSLATORS[api][0]


@pytest.mark.parametrize("api,turn", [(a, t) for a in PARAMS for t in ("text", "tools")
                                      if not (a == "completions" and t == "tools")])  # a completion has no calls
def test_resume_at_every_cursor_is_the_rest_of_the_live_stream(api, turn):
    """At every frame's cursor: the chunk's own on its last frame and "event.k" on frame k
    before it (a client cut between two frames of one chunk resumes with the next frame)."""
    chunks = text_script() if turn == "text" else script()
    translate = _translator(api)

    async def go():
        live = b"".join(await _collect(translate(SID, PARAMS[api], _source(chunks))))
        cursors = re.findall(rb"^id: (\S+)$", live, re.M)
        assert len(cursors) >= len(chunks)
        for raw in cursors:
            _, event, frame = sse.parse_cursor(raw.decode())
            part = None if frame is None else (event, frame + 1)
            drop = [True, 0]
            after = event if frame is None else event - 1
            rest = b"".join(await _collect(resume.after_cursor(
                translate(SID, PARAMS[api], resume.marked(_source(chunks), after, drop, part)), drop, SID)))
            at = live.index(b"id: " + raw + b"\n")
            seen = live[:live.index(b"\n\n", at) + 2]  # up to the end of the frame that carried the cursor
            assert seen + rest == live, f"resumed after {raw!r}"
        return live, cursors
    live, cursors = asyncio.run(go())
    assert b"<tool_call>" not in live and b"<think>" not in live
    if turn == "text":  # its last chunk ends the text and the turn: more than one frame
        assert any(b"." in c.rpartition(b":")[2] for c in cursors)


def _sse_data(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]


def test_each_api_streams_the_call_arguments_as_fragments():
    async def run(api):
        return _sse_data(b"".join(await _collect(_translator(api)(SID, PARAMS[api], _source(script())))))
    chat = asyncio.run(run("chat.completions"))
    frags = [tc["function"].get("arguments") for e in chat for ch in e["choices"]
             for tc in ch["delta"].get("tool_calls") or []]
    assert frags == ["", '{"account": ', '"a-1"}']
    assert "".join(e["choices"][0]["delta"].get("reasoning_content", "") for e in chat if e["choices"]) == \
        "Need the code."
    assert [e["choices"][0]["finish_reason"] for e in chat if e["choices"] and e["choices"][0]["finish_reason"]] \
        == ["tool_calls"]
    ant = asyncio.run(run("anthropic.messages"))
    kinds = [e["content_block"]["type"] for e in ant if e["type"] == "content_block_start"]
    assert kinds == ["thinking", "text", "tool_use"]
    assert [e["delta"]["partial_json"] for e in ant if e["type"] == "content_block_delta"
            and e["delta"]["type"] == "input_json_delta"] == ['{"account": ', '"a-1"}']
    assert [e["delta"]["stop_reason"] for e in ant if e["type"] == "message_delta"] == ["tool_use"]
    rs = asyncio.run(run("responses"))
    assert [e["delta"] for e in rs if e["type"] == "response.function_call_arguments.delta"] == \
        ['{"account": ', '"a-1"}']
    done = [e for e in rs if e["type"] == "response.completed"][0]["response"]
    assert [o["type"] for o in done["output"]] == ["reasoning", "message", "function_call"]
    assert done["output"][2]["arguments"] == '{"account": "a-1"}'


def test_ollama_sends_the_whole_call_in_the_line_where_it_ends():
    async def go():
        return [json.loads(x) for x in await _collect(ollama.lines("m", True, _source(script()), 0.0, wall=True))]
    lines = asyncio.run(go())
    calls = [x["message"]["tool_calls"] for x in lines if x["message"].get("tool_calls")]
    assert calls == [[{"function": {"name": "lookup", "arguments": {"account": "a-1"}}}]] or \
        calls[0][0]["function"]["arguments"] == {"account": "a-1"}
    assert "".join(x["message"].get("thinking", "") for x in lines) == "Need the code."
    assert lines[-1]["done"] is True
