"""The native session API on a real daemon: every verb, continuation, one generation at a
time, bad input, chat completions as sessions, resumable streams and subscriptions."""

import threading
import time

import httpx
import pytest

from superfluid.client import APIError, Client, iter_sse
from superfluid.api.sse import parse_cursor

from .conftest import MODEL
from .daemon import Daemon


@pytest.fixture(scope="module")
def d():
    dm = Daemon("--resume-grace", "30")
    yield dm
    dm.stop()


@pytest.fixture(scope="module")
def c(d):
    with Client(d.url, timeout=120) as cl:
        yield cl


def new(c, text="Name three colors.", **kw):
    s = c.create(system="Be brief.", temperature=0, **kw)
    c.append(s["id"], "user", text)
    return s["id"]


def test_every_verb(c):
    s = c.create(system="Be brief.", temperature=0, title="first")
    sid = s["id"]
    assert s["title"] == "first" and s["events"] == 3 and s["epoch"] >= 1 and not s["busy"]
    ev = c.append(sid, "user", "Name three colors.")
    assert ev[0]["type"] == "message" and ev[0]["id"] == 3 and ev[0]["span"]
    got = list(c.stream(sid, max_tokens=12))
    assert got[-1]["finish"] in ("length", "end_of_turn")
    assert [e["id"] for e in got] == list(range(got[0]["id"], got[0]["id"] + len(got)))  # dense cursors
    log = c.events(sid)
    assert [e["id"] for e in log] == list(range(len(log)))
    assert log[4]["type"] == "generation_prompt"
    assert "".join(e["text"] for e in log if e["type"] == "generated") == "".join(e["text"] for e in got)
    assert c.events(sid, after=len(log) + 5) == []
    info = c.get(sid)
    assert info["tokens"] == sum(len(e.get("span", [])) for e in log)
    assert info["busy"] is False
    assert c.update(sid, title="renamed", archived=True)["title"] == "renamed"
    assert c.get(sid)["archived"] is True
    assert any(x["id"] == sid for x in c.list(archived=True))
    assert all(x["id"] != sid for x in c.list(archived=False))
    f = c.fork(sid, at=3)
    assert f["parent"] == sid and f["fork_at"] == 3 and f["id"] != sid
    assert [e["id"] for e in c.events(f["id"])][:4] == [0, 1, 2, 3]
    assert c.events(sid) == log + [e for e in c.events(sid) if e["id"] >= len(log)]  # parent untouched
    t = c.trim(sid, 3)
    assert t["tokens"] == sum(len(e.get("span", [])) for e in log[:4]) and not t["turn_open"]
    assert c.events(sid)[-1]["type"] == "trim"
    c.purge(sid)
    with pytest.raises(APIError) as e:
        c.get(sid)
    assert e.value.status == 404 and e.value.code == "session_not_found"
    assert all(x["id"] != sid for x in c.list())


def text_of(c, sid):
    return "".join(e["text"] for e in c.events(sid) if e["type"] == "generated")


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 1234}],
                         ids=["greedy", "seeded"])
def test_cut_and_continue_equals_an_uncut_generation(c, sampling):
    whole = c.create(system="Be brief.", **sampling)
    c.append(whole["id"], "user", "Write a short poem about the sea.")
    full = c.generate(whole["id"], max_tokens=40)
    cut = c.create(system="Be brief.", **sampling)
    c.append(cut["id"], "user", "Write a short poem about the sea.")
    first = c.generate(cut["id"], max_tokens=9)
    assert first["finish"] == "length"
    assert c.get(cut["id"])["turn_open"]
    rest = c.generate(cut["id"], max_tokens=31)
    assert first["text"] + rest["text"] == full["text"]
    assert rest["usage"]["cached_tokens"] > 0  # the cut turn's KV was still warm


def test_one_generation_at_a_time(c):
    sid = new(c, "Write a very long story about a dragon.")
    it = c.stream(sid, max_tokens=400)
    next(it)
    for call in (lambda: c.generate(sid, max_tokens=4), lambda: c.append(sid, "user", "x"),
                 lambda: c.trim(sid, 2)):
        with pytest.raises(APIError) as e:
            call()
        assert e.value.status == 409 and e.value.code == "session_busy"
    assert c.get(sid)["busy"]
    assert c.cancel(sid) is True
    rest = list(it)
    assert rest[-1]["finish"] == "cancelled"
    deadline = time.monotonic() + 10
    while c.get(sid)["busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    log = c.events(sid)
    assert log[-1]["type"] == "generated" and log[-1]["finish"] == "cancelled"
    assert c.get(sid)["turn_open"]  # a cancelled turn continues on the next generate
    assert c.generate(sid, max_tokens=3)["finish"] in ("length", "end_of_turn")


def test_tool_calls_and_results_are_events(d, c):
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [{"type": "function",
              "function": {"name": "get_weather", "description": "Weather in a city", "parameters": params}}]
    s = c.create(temperature=0, tools=tools)
    sid = s["id"]
    c.append(sid, "user", "What is the weather in Paris?")
    r = httpx.post(f"{d.url}/v1/sessions/{sid}/messages", timeout=30, json={
        "role": "assistant", "content": "",
        "tool_calls": [{"id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})
    assert r.status_code == 200
    evs = r.json()["data"]
    assert [e["type"] for e in evs] == ["message", "tool_use"]
    assert evs[1]["name"] == "get_weather" and evs[1]["call_id"] == "call_1" and "Paris" in evs[1]["arguments"]
    res = c.tool_result(sid, "call_1", "18 C and sunny")
    assert res[0]["type"] == "tool_result" and res[0]["call_id"] == "call_1" and res[0]["span"]
    out = c.generate(sid, max_tokens=16)
    assert out["text"] and out["finish"] in ("length", "end_of_turn")
    r = httpx.post(f"{d.url}/v1/sessions/{sid}/messages", timeout=30, json={
        "role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]})
    assert r.status_code == 400


def test_bad_input(d, c):
    with pytest.raises(APIError) as e:
        c.get("sess-doesnotexist")
    assert e.value.status == 404
    sid = new(c)
    for path, body in [("fork", {"at": 999}), ("trim", {"to": 999}), ("trim", {"to": "x"}),
                       ("messages", {"role": "wizard", "content": "x"}), ("messages", {"content": 3}),
                       ("generate", {"max_tokens": 0}), ("generate", {"temperature": "hot"})]:
        r = httpx.post(f"{d.url}/v1/sessions/{sid}/{path}", json=body, timeout=30)
        assert r.status_code == 400, (path, body, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
    r = httpx.post(f"{d.url}/v1/sessions/{sid}/messages", content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"]
    r = httpx.post(f"{d.url}/v1/sessions", json={"model": 5}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.get(f"{d.url}/v1/sessions/{sid}/events", params={"after": "x"}, timeout=30)
    assert r.status_code == 400
    empty = c.create(temperature=0)
    with pytest.raises(APIError) as e:
        c.generate(empty["id"], max_tokens=3)
    assert e.value.status == 400
    assert len(c.events(sid)) == 3  # created, system, user: nothing above touched the log


def test_a_chat_completion_is_a_session(d):
    body = {"model": MODEL, "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]}
    r = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200
    sid = r.headers["x-superfluid-session"]
    log = httpx.get(f"{d.url}/v1/sessions/{sid}/events", timeout=30).json()["data"]
    assert [e["type"] for e in log[:4]] == ["created", "message", "message", "generation_prompt"]
    assert [e["role"] for e in log[1:3]] == ["system", "user"]
    gen = [e for e in log if e["type"] == "generated"]
    assert "".join(e["text"] for e in gen) == r.json()["choices"][0]["message"]["content"]
    assert sum(len(e["span"]) for e in gen) == r.json()["usage"]["completion_tokens"]
    assert sum(len(e.get("span", [])) for e in log[:4]) == r.json()["usage"]["prompt_tokens"]
    assert log[0]["params"]["response_id"] == r.json()["id"]
    two = httpx.post(d.url + "/v1/chat/completions", json={**body, "n": 2}, timeout=60)
    ids = two.headers["x-superfluid-session"].split(",")
    assert len(ids) == 2 and ids[0] != ids[1]
    fork = httpx.get(f"{d.url}/v1/sessions/{ids[1]}", timeout=30).json()
    assert fork["parent"] == ids[0] and fork["fork_at"] == 3  # the choices share the prompt's events


def _stream_some(d, body, n):
    """Start a streamed chat completion, read n content events, then drop the connection."""
    seen, last_id = [], None
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=60) as r:
        sid = r.headers["x-superfluid-session"]
        lines = r.iter_lines()
        for eid, data in iter_sse(lines):
            if isinstance(data, dict) and data["choices"] and data["choices"][0]["delta"].get("content"):
                seen.append(data["choices"][0]["delta"]["content"])
                last_id = eid
                if len(seen) >= n:
                    break
    return sid, seen, last_id


def _resume(d, sid, last_id):
    out, finish = [], None
    with httpx.stream("GET", f"{d.url}/v1/sessions/{sid}/resume", headers={"Last-Event-ID": last_id},
                      timeout=60) as r:
        assert r.status_code == 200
        for _, data in iter_sse(r.iter_lines()):
            if data == "[DONE]":
                break
            ch = data["choices"][0]
            out.append(ch["delta"].get("content", ""))
            finish = ch["finish_reason"] or finish
    return out, finish


@pytest.mark.parametrize("wait_for_end", [False, True], ids=["live", "from-the-log"])
def test_a_dropped_stream_resumes_with_last_event_id(d, wait_for_end):
    body = {"model": MODEL, "max_tokens": 60, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]}
    ref = httpx.post(d.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=60).json()
    sid, seen, last_id = _stream_some(d, body, 5)
    assert last_id.startswith(sid + ":")
    if wait_for_end:
        deadline = time.monotonic() + 60
        while httpx.get(f"{d.url}/v1/sessions/{sid}", timeout=30).json()["busy"] and time.monotonic() < deadline:
            time.sleep(0.1)
    rest, finish = _resume(d, sid, last_id)
    assert "".join(seen + rest) == ref["choices"][0]["message"]["content"]
    assert finish == ref["choices"][0]["finish_reason"]


def test_subscribe_gets_backlog_then_live_events_once(d, c):
    sid = new(c, "Count from one to twenty.")
    got: list[dict] = []

    def listen():
        with Client(d.url) as sub:
            for ev in sub.subscribe(sid, after=1):
                got.append(ev)
                if ev["type"] == "generated" and ev["finish"] is not None:
                    return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    deadline = time.monotonic() + 30  # the backlog (the user message, event 2) came: it is subscribed
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["id"] for e in got] == [2]
    out = c.generate(sid, max_tokens=20)
    t.join(30)
    ids = [e["id"] for e in got]
    assert ids == list(range(2, ids[-1] + 1))  # from the cursor on, dense, no duplicates
    assert "".join(e["text"] for e in got if e["type"] == "generated") == out["text"]


@pytest.mark.parametrize("path,body", [
    ("/v1/messages", {"max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/responses", {"max_output_tokens": 8, "stream": True, "input": "Hi"}),
    ("/v1/completions", {"max_tokens": 8, "stream": True, "prompt": "Once upon a time"}),
], ids=["anthropic", "responses", "completions"])
def test_every_sse_api_tags_committed_tokens_with_their_cursor(d, path, body):
    with httpx.stream("POST", d.url + path, json={"model": MODEL, "temperature": 0, **body}, timeout=60) as r:
        assert r.status_code == 200
        sid = r.headers["x-superfluid-session"]
        ids = [eid for eid, _ in iter_sse(r.iter_lines()) if eid]
    assert ids and all(i.startswith(sid + ":") for i in ids)
    # every frame has a cursor: "sid:event" on a chunk's last frame, "sid:event.k" before it
    order = [(ev, 1 << 30 if k is None else k) for _, ev, k in map(parse_cursor, ids)]
    assert order == sorted(set(order))
    log = httpx.get(f"{d.url}/v1/sessions/{sid}/events", timeout=30).json()["data"]
    assert {e["id"] for e in log if e["type"] == "generated"} >= {ev for ev, _ in order}


def test_renaming_a_session_mid_generation_does_not_disturb_it(c):
    sid = new(c, "Count from one to thirty.")
    it = c.stream(sid, max_tokens=30)
    first = next(it)
    assert c.update(sid, title="renamed while generating")["title"] == "renamed while generating"
    rest = list(it)
    assert rest[-1]["finish"] in ("length", "end_of_turn")
    log = c.events(sid)
    assert any(e["type"] == "meta" for e in log)
    gen = [e for e in log if e["type"] == "generated"]
    assert "".join(e["text"] for e in gen) == first["text"] + "".join(e["text"] for e in rest)
    resumed = list(c.resume(sid, after=first["id"]))  # the title change is not the generation's end
    assert "".join(e.get("text", "") for _, e in resumed if e.get("type") == "generated") == \
        "".join(e["text"] for e in rest)
