"""The service on the real path from tokens, in one process: Service.submit / generate with
real Sessions over an in-memory store, the real engine on a fake runtime, the OpenAI chat
translator, and resume (api/resume.py) read back from the same log."""

import asyncio
import json
import re

import pytest

from superfluid.api import anthropic, responses, resume, streams
from superfluid.api.prompt import chat_prompt
from superfluid.api.response_store import ResponseStore
from superfluid.errors import BadRequest, ContextLengthExceeded
from superfluid.request import CallDelta, Calls, FinishReason, GenRequest, Qos, SamplingParams
from superfluid.service import Service, Sessions
from superfluid.session.events import Generated
from superfluid.session.store import Store

from ..fakes import FakeModel

GREEDY = SamplingParams(temperature=0)
CREATED = 1700000000
TOOLS = [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]


def turn_script(m: FakeModel) -> list[int]:
    """A turn that reasons, says a little, then calls f(a=1)."""
    return m.vocab.script("<think>", "hm", "</think>", " Let", " me", " look", ".", "<tool_call>", '{"name": ',
                          '"f"', ', "arguments": ', '{"a": ', "1", "}}", "</tool_call>")


def run(m: FakeModel, body, **cfg):
    async def go():
        store = Store(None).open()
        sessions = Sessions(store, grace=0)
        eng = m.engine(sessions, **cfg)
        await eng.start()
        try:
            return await body(eng, Service(sessions), sessions)
        finally:
            await eng.close()
            store.close()
    return asyncio.run(go())


def kinds(sessions: Sessions, sid: str) -> list[str]:
    """The session's events in the store now (read on the writer, without the event loop)."""
    rows = sessions.store.call_sync(lambda c: c.execute(
        "SELECT kind FROM events WHERE session=? ORDER BY id", (sid,)).fetchall())
    return [k for (k,) in rows]


async def chat(eng, service: Service, content: str = "call f", **kw):
    """What POST /v1/chat/completions with stream: true does (api/app.py), to the bytes."""
    cp = chat_prompt(eng, [{"role": "user", "content": content}], tools=TOOLS)
    rid = "chatcmpl-1"
    lp = kw.pop("logprobs", False)
    sp = SamplingParams(temperature=0, top_logprobs=0 if lp else -1)
    r = GenRequest(f"{rid}-0", cp.prompt, sp, kw.pop("max_tokens", 64), channels=cp.channels)
    its = await service.submit(eng, [r], cp.bodies, api="chat.completions", params={
        "response_id": rid, "created": CREATED, "logprobs": lp, "include_usage": True})
    live = b"".join([b async for b in streams.chat_events(rid, eng.model_id, its, lp, True, [r],
                                                          created=CREATED)])
    return r, live


def test_the_prompt_is_committed_before_the_engine_sees_the_request():
    m = FakeModel()
    seen: list = []

    async def body(eng, service, sessions):
        submit = eng.submit

        def watched(r):
            seen.append((r.session, kinds(sessions, r.session), sessions.busy(r.session)))
            return submit(r)
        eng.submit = watched
        r, _ = await chat(eng, service, "hello")
        return r, kinds(sessions, r.session)
    r, after = run(m, body)
    (sid, before, busy), = seen
    assert sid == r.session and busy
    assert before == ["created", "message", "message", "generation_prompt"]  # system (the tools), user, opener
    assert after[:len(before)] == before and set(after[len(before):]) == {"generated"}


def test_a_request_too_long_for_the_context_leaves_nothing_running():
    m = FakeModel(n_ctx=256)

    async def body(eng, service, sessions):
        with pytest.raises(ContextLengthExceeded):
            await chat(eng, service, "hello", max_tokens=10_000)
        await asyncio.sleep(0)
        return eng.idle, await sessions.store.sessions(), sessions.live.by_session, m.runtime.batches
    idle, rows, busy, batches = run(m, body)
    assert idle and rows == [] and busy == {} and batches == []


def test_generate_on_a_session_refused_appends_nothing():
    """A budget past the window is capped (limits.output_budget), not refused; a refused one
    (a budget below 1) appends nothing to the session."""
    m = FakeModel(n_ctx=256)

    async def body(eng, service, sessions):
        st = await sessions.create(eng, params={}, messages=[{"role": "user", "content": "hi"}])
        before = kinds(sessions, st.id)
        with pytest.raises(BadRequest):
            await service.generate(eng, st.id, max_tokens=0, overrides={}, stop=None, qos=Qos.AGENT)
        refused = (kinds(sessions, st.id), sessions.busy(st.id), eng.idle)
        req, it = await service.generate(eng, st.id, max_tokens=None, overrides={"temperature": 0}, stop=None,
                                         qos=Qos.AGENT)
        chunks = [c async for c in it]
        return before, refused, chunks, kinds(sessions, st.id), await sessions.state(st.id)
    before, (after_refusal, busy, idle), chunks, kinds_after, state = run(m, body)
    assert after_refusal == before and not busy and idle
    assert "".join(c.text for c in chunks) == "Hello world." and chunks[-1].finish == FinishReason.END_OF_TURN
    assert kinds_after == before + ["generation_prompt"] + ["generated"] * 4
    assert not state.turn_open


def test_output_is_logged_as_typed_events_and_resumes_at_every_cursor_as_the_openai_stream():
    m = FakeModel()
    m.reply = lambda prompt: turn_script(m)

    async def body(eng, service, sessions):
        r, live = await chat(eng, service)
        sid = r.session
        events = await sessions.store.events(sid)
        cursors = [int(x) for x in re.findall(rb"id: " + sid.encode() + rb":(\d+)\n", live)]
        opener = max(ev.id for ev in events if ev.kind == "generation_prompt")
        rests = {}
        for after in [opener] + [ev.id for ev in events if ev.id > opener]:
            rests[after] = b"".join([b async for b in resume.rest_of_generation(sessions, sid, after)])
        return sid, live, events, cursors, opener, rests
    sid, live, events, cursors, opener, rests = run(m, body)

    gen = [ev.body for ev in events if isinstance(ev.body, Generated)]
    assert "".join(g.text for g in gen) == " Let me look."
    assert "".join(g.reasoning for g in gen) == "hm"
    assert not any("<" in g.text for g in gen)  # no <think> or <tool_call> markup in the content
    deltas = [CallDelta.from_wire(d) for g in gen for d in g.calls]
    assert deltas[0].name == "f" and deltas[0].id.startswith("call_") and deltas[-1].end and not deltas[-1].cut
    assert len([d for d in deltas if d.arguments]) > 1  # the arguments were logged as they were generated
    calls = Calls()
    calls.add(deltas)
    assert [(c.name, json.loads(c.arguments)) for c in calls.done] == [("f", {"a": 1})]
    assert gen[-1].finish == "end_of_turn" and sum(len(g.span) for g in gen) == len(turn_script(m)) + 1

    # the live stream, as a client read it
    assert b"<tool_call>" not in live and b"<think>" not in live
    data = [json.loads(x[6:]) for x in live.split(b"\n") if x.startswith(b"data: {")]
    deltas_out = [e["choices"][0]["delta"] for e in data if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas_out) == " Let me look."
    assert "".join(d.get("reasoning_content") or "" for d in deltas_out) == "hm"
    args = [tc["function"]["arguments"] for d in deltas_out for tc in d.get("tool_calls") or []]
    assert json.loads("".join(args)) == {"a": 1} and len([a for a in args if a]) > 1
    assert [e["choices"][0]["finish_reason"] for e in data if e["choices"] and e["choices"][0]["finish_reason"]] \
        == ["tool_calls"]

    # resumed after any cursor the client saw: exactly the rest of the live stream
    assert len(cursors) >= 5 and cursors == sorted(cursors)
    assert rests[opener] == live  # before the first token: all of it
    for after in cursors:
        at = live.index(f"id: {sid}:{after}\n".encode())
        seen = live[:live.index(b"\n\n", at) + 2]
        assert seen + rests[after] == live, f"resumed after event {after}"
    # and after any event at all (one whose tokens sent nothing, such as markup, too): the rest
    # after the last frame the client could have seen by then (the role frame, at least)
    role_end = live.index(b"\n\n") + 2
    for after, rest in rests.items():
        if after == opener:
            continue
        last = max((c for c in cursors if c <= after), default=None)
        cut = role_end if last is None else live.index(b"\n\n", live.index(f"id: {sid}:{last}\n".encode())) + 2
        assert live[:cut] + rest == live, f"resumed after event {after}"


def check_rest(live: bytes, rests: dict[int, bytes], sid: str) -> None:
    """Each resumed stream is exactly the live stream after the frame that carried the
    cursor; after an event that sent nothing (markup), what comes after the last cursor
    before it; before any cursor, the live stream less what the translator said first."""
    cursors = [int(x) for x in re.findall(rb"id: " + sid.encode() + rb":(\d+)\n", live)]
    assert len(cursors) >= 5 and cursors == sorted(cursors)

    def after_frame(c: int) -> int:
        return live.index(b"\n\n", live.index(f"id: {sid}:{c}\n".encode())) + 2
    for c in cursors:
        assert live[:after_frame(c)] + rests[c] == live, f"resumed after event {c}"
    head = {rest for after, rest in rests.items() if after < cursors[0] and rest != live}
    assert len(head) <= 1  # after the opener it is all of it; after markup before any cursor, one same rest
    for rest in head:
        cut = len(live) - len(rest)
        assert live.endswith(rest) and live[:cut].endswith(b"\n\n") and cut <= live.index(f"id: {sid}:".encode())
    for after, rest in rests.items():
        last = max((c for c in cursors if c <= after), default=None)
        if last is not None:
            assert rest == rests[last], f"resumed after event {after}"


def _data(live: bytes) -> list[dict]:
    return [json.loads(x[6:]) for x in live.split(b"\n") if x.startswith(b"data: {")]


@pytest.mark.parametrize("api", ["anthropic.messages", "responses"])
def test_anthropic_and_responses_streams_of_the_same_turn_resume_in_their_own_format(api):
    m = FakeModel()
    m.reply = lambda prompt: turn_script(m)

    async def body(eng, service, sessions):
        cp = chat_prompt(eng, [{"role": "user", "content": "call f"}], tools=TOOLS)
        r = GenRequest("gen-1", cp.prompt, GREEDY, 64, channels=cp.channels)
        if api == "anthropic.messages":
            (it,) = await service.submit(eng, [r], cp.bodies, api=api, params={"response_id": r.id, "marked": 0})
            live_stream = anthropic.events(r.id, eng.model_id, len(cp.prompt), it, r.session, 0)
        else:
            base = {"id": "resp_1", "object": "response", "created_at": CREATED, "model": eng.model_id,
                    "store": False}
            params = {"response_id": "resp_1", "base": base, "input_items": []}
            translate = responses._replay(ResponseStore(sessions.store))
            resume.register("responses", translate)  # as the app's routes do
            (it,) = await service.submit(eng, [r], cp.bodies, api=api, params=params)
            live_stream = translate(r.session, params, it)
        live = b"".join([b async for b in live_stream])
        events = await sessions.store.events(r.session)
        opener = max(ev.id for ev in events if ev.kind == "generation_prompt")
        rests = {after: b"".join([b async for b in resume.rest_of_generation(sessions, r.session, after)])
                 for after in [opener] + [ev.id for ev in events if ev.id > opener]}
        return r.session, live, opener, rests
    sid, live, opener, rests = run(m, body)

    assert b"<tool_call>" not in live and b"<think>" not in live
    data = _data(live)
    if api == "anthropic.messages":
        assert [e["content_block"]["type"] for e in data if e["type"] == "content_block_start"] == \
            ["thinking", "text", "tool_use"]
        deltas = [e["delta"] for e in data if e["type"] == "content_block_delta"]
        assert "".join(d.get("thinking", "") for d in deltas) == "hm"
        assert "".join(d.get("text", "") for d in deltas) == " Let me look."
        args = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
        assert [e["delta"]["stop_reason"] for e in data if e["type"] == "message_delta"] == ["tool_use"]
    else:
        args = [e["delta"] for e in data if e["type"] == "response.function_call_arguments.delta"]
        done = [e for e in data if e["type"] == "response.completed"][0]["response"]
        assert [o["type"] for o in done["output"]] == ["reasoning", "message", "function_call"]
        assert json.loads(done["output"][2]["arguments"]) == {"a": 1}
    assert json.loads("".join(args)) == {"a": 1} and len(args) > 1  # streamed in fragments
    assert rests[opener] == live
    check_rest(live, rests, sid)


def test_logprobs_with_tools_cover_the_content_tokens_only_live_and_resumed():
    m = FakeModel()
    m.reply = lambda prompt: turn_script(m)

    async def body(eng, service, sessions):
        r, live = await chat(eng, service, logprobs=True)
        events = await sessions.store.events(r.session)
        opener = max(ev.id for ev in events if ev.kind == "generation_prompt")
        rests = {after: b"".join([b async for b in resume.rest_of_generation(sessions, r.session, after)])
                 for after in [opener] + [ev.id for ev in events if ev.id > opener]}
        return r.session, live, opener, rests
    sid, live, opener, rests = run(m, body)
    data = _data(live)
    content = [x for e in data if e["choices"] for x in (e["choices"][0].get("logprobs") or {}).get("content") or []]
    assert [x["token"] for x in content] == [" Let", " me", " look", "."]  # one per content token, no markup
    assert all(x["logprob"] <= 0 and x["bytes"] == list(x["token"].encode()) for x in content)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in data if e["choices"]) == " Let me look."
    assert rests[opener] == live
    check_rest(live, rests, sid)


def raw_completion(m: FakeModel):
    """POST /v1/completions with logprobs, streamed (api/app.py): no channels, the prompt
    committed as one raw message. Returns the session, the live bytes, the log's event kinds
    and the resumed stream after each generated event."""
    async def body(eng, service, sessions):
        r = GenRequest("cmpl-1-0", eng.encode_prompt("Hello"), SamplingParams(temperature=0, top_logprobs=1), 16)
        its = await service.submit(eng, [r], api="completions", params={
            "response_id": "cmpl-1", "created": CREATED, "logprobs": True, "include_usage": False})
        live = b"".join([b async for b in streams.completion_events("cmpl-1", eng.model_id, its, True, False,
                                                                    [r], created=CREATED)])
        events = await sessions.store.events(r.session)
        rests = {ev.id: b"".join([b async for b in resume.rest_of_generation(sessions, r.session, ev.id)])
                 for ev in events if ev.kind == "generated"}
        return r.session, live, [ev.kind for ev in events], rests
    m.reply = lambda prompt: m.vocab.script(" Once", " upon", " a", " time", ".")
    return run(m, body)


def test_a_raw_completion_streams_text_with_logprobs_and_offsets():
    sid, live, kinds_, rests = raw_completion(FakeModel())
    assert kinds_ == ["created", "message"] + ["generated"] * 6
    data = _data(live)
    assert "".join(e["choices"][0]["text"] for e in data) == " Once upon a time."
    offsets = [o for e in data if e["choices"][0]["logprobs"] for o in e["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 5, 10, 12, 17]
    assert [e["choices"][0]["finish_reason"] for e in data][-1] == "stop"
    assert [int(x) for x in re.findall(rb"id: " + sid.encode() + rb":(\d+)\n", live)] == [2, 3, 4, 5, 6, 7]


def test_a_raw_completion_resumes_at_every_cursor():
    sid, live, _, rests = raw_completion(FakeModel())
    check_rest(live, rests, sid)
