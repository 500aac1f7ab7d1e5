"""Responses API background mode (create, poll, stream from `starting_after`, cancel), metadata,
seed, model through previous_response_id and input_items paging: against a real daemon with
API keys, driven by the official `openai` client and httpx."""

import json
import time

import httpx
import openai
import pytest

from .conftest import MODEL
from .daemon import Daemon

POLICY = {"keys": [{"name": "alice", "key": "sk-alicealice"}, {"name": "bob", "key": "sk-bobbobbob"}]}
ADMIN = "sk-admin-key"
LONG = "Count from 1 to 1000, one number per line: 1, 2, 3, 4,"


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    p = tmp_path_factory.mktemp("policy") / "keys.json"
    p.write_text(json.dumps(POLICY))
    daemon = Daemon("--api-key", ADMIN, "--key-policy", str(p), max_batch=2, max_context=2048)
    yield daemon
    daemon.stop()


def client_for(d, key="sk-alicealice"):
    return openai.OpenAI(base_url=d.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def c(d):
    return client_for(d)


def poll(c, rid, until=lambda r: r.status not in ("queued", "in_progress")):
    """Poll until `until` holds (the test's own timeout bounds it)."""
    while True:
        r = c.responses.retrieve(rid)
        if until(r):
            return r
        time.sleep(0.05)


def frames(raw: bytes) -> list[bytes]:
    """An SSE body's events, without comment (ping) lines."""
    return [f + b"\n\n" for f in raw.split(b"\n\n") if f and not f.startswith(b":")]


def seq(frame: bytes) -> int:
    return json.loads(frame[frame.index(b"data: ") + 6:])["sequence_number"]


def test_background_returns_at_once_and_polls_to_completed_with_metadata(c):
    r = c.responses.create(model=MODEL, input="Say hello.", background=True, max_output_tokens=8, temperature=0,
                           metadata={"job": "greeting", "team": "a"})
    assert r.status in ("queued", "in_progress") and r.background and r.output == []
    assert r.metadata == {"job": "greeting", "team": "a"}
    done = poll(c, r.id)
    assert done.status in ("completed", "incomplete") and done.output_text
    assert done.metadata == {"job": "greeting", "team": "a"} and done.usage.output_tokens >= 1


def test_background_stream_resumes_after_any_sequence_number_with_the_same_events(d, c):
    h = {"authorization": "Bearer sk-alicealice"}
    body = {"model": MODEL, "input": "Name three fruits.", "max_output_tokens": 12, "temperature": 0,
            "background": True, "stream": True}
    with httpx.stream("POST", d.url + "/v1/responses", json=body, headers=h, timeout=60) as r:
        assert r.status_code == 200
        whole = frames(r.read())
    assert [seq(f) for f in whole] == list(range(len(whole)))
    rid = json.loads(whole[0][whole[0].index(b"data: ") + 6:])["response"]["id"]
    for n in (0, 2, len(whole) // 2, len(whole) - 2, len(whole) - 1):
        got = httpx.get(f"{d.url}/v1/responses/{rid}", params={"stream": "true", "starting_after": n},
                        headers=h, timeout=60)
        assert frames(got.content) == whole[n + 1:], n  # byte-equal tail, log cursors included
    sdk = list(c.responses.retrieve(rid, stream=True, starting_after=3))
    assert [e.sequence_number for e in sdk] == list(range(4, len(whole)))
    assert sdk[-1].type in ("response.completed", "response.incomplete")
    assert sdk[-1].response.output_text == c.responses.retrieve(rid).output_text


def test_a_background_stream_survives_its_client_and_resumes_live(d, c):
    h = {"authorization": "Bearer sk-alicealice"}
    body = {"model": MODEL, "input": LONG, "max_output_tokens": 40, "temperature": 0, "background": True,
            "stream": True}
    seen: list[bytes] = []
    with httpx.stream("POST", d.url + "/v1/responses", json=body, headers=h, timeout=60) as r:
        buf = b""
        for part in r.iter_bytes():
            buf += part
            *done, buf = buf.split(b"\n\n")
            seen += [f + b"\n\n" for f in done if f and not f.startswith(b":")]
            if len(seen) >= 5:
                break  # the client goes away mid-stream
    rid = json.loads(seen[0][seen[0].index(b"data: ") + 6:])["response"]["id"]
    rest = frames(httpx.get(f"{d.url}/v1/responses/{rid}", params={"stream": "true", "starting_after": seq(seen[-1])},
                            headers=h, timeout=60).content)
    whole = frames(httpx.get(f"{d.url}/v1/responses/{rid}", params={"stream": "true"}, headers=h, timeout=60).content)
    assert seen + rest == whole
    final = poll(c, rid)
    assert final.status in ("completed", "incomplete") and final.usage.output_tokens >= 5


def lanes_active(d) -> float:
    text = httpx.get(d.url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("superfluid_lanes_active"))


def test_cancel_stops_a_running_background_response_and_frees_its_lane(d, c):
    r = c.responses.create(model=MODEL, input=LONG, background=True, max_output_tokens=1500, temperature=0)
    poll(c, r.id, lambda x: x.status != "queued")
    cancelled = c.responses.cancel(r.id)
    assert cancelled.status == "cancelled" and cancelled.id == r.id
    assert c.responses.retrieve(r.id).status == "cancelled"
    assert c.responses.cancel(r.id).status == "cancelled"  # again: the same answer
    while lanes_active(d) != 0:  # the lane is free (the test's own timeout bounds the wait)
        time.sleep(0.05)
    evs = list(c.responses.retrieve(r.id, stream=True))
    assert evs[-1].response.status == "cancelled"
    assert evs[-1].response.usage.output_tokens < 1500

    done = c.responses.create(model=MODEL, input="hi", background=True, max_output_tokens=2)
    poll(c, done.id)
    with pytest.raises(openai.BadRequestError, match="only a queued or in-progress"):
        c.responses.cancel(done.id)
    fg = c.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="only a background response"):
        c.responses.cancel(fg.id)


def test_another_key_cannot_see_poll_stream_or_cancel_it(d, c):
    r = c.responses.create(model=MODEL, input=LONG, background=True, max_output_tokens=200, temperature=0)
    bob = client_for(d, "sk-bobbobbob")
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.cancel(r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.input_items.list(r.id)
    got = httpx.get(f"{d.url}/v1/responses/{r.id}", params={"stream": "true"}, timeout=30,
                    headers={"authorization": "Bearer sk-bobbobbob"})
    assert got.status_code == 404
    assert client_for(d, ADMIN).responses.retrieve(r.id).id == r.id  # the admin sees all
    assert c.responses.cancel(r.id).status in ("cancelled", "completed", "incomplete")


def test_bad_background_metadata_and_seed_are_typed_400s(c):
    def bad(param, **kw):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model=MODEL, input="hi", max_output_tokens=2, **kw)
        assert e.value.body["param"].startswith(param), e.value.body

    bad("background", background=True, store=False)
    bad("background", extra_body={"background": "yes"})
    bad("metadata", metadata={f"k{i}": "v" for i in range(17)})
    bad("metadata", metadata={"k" * 65: "v"})
    bad("metadata.k", metadata={"k": "v" * 513})
    bad("metadata.k", extra_body={"metadata": {"k": 1}})
    bad("metadata", extra_body={"metadata": ["a"]})
    bad("seed", extra_body={"seed": "7"})
    ok = c.responses.create(model=MODEL, input="hi", max_output_tokens=2,
                            metadata={f"k{i}": "v" * 512 for i in range(16)})
    assert len(ok.metadata) == 16
    for q in ({"starting_after": "x"}, {"starting_after": "-2"}):
        with pytest.raises(openai.BadRequestError):
            c.responses.retrieve(ok.id, stream=True, extra_query=q)


def test_seed_gives_the_same_text_at_temperature_above_zero(c):
    kw = dict(model=MODEL, input="Write a short poem about rain.", max_output_tokens=16, temperature=1.0,
              extra_body={"seed": 1234})
    assert c.responses.create(**kw).output_text == c.responses.create(**kw).output_text


def test_model_is_inherited_through_previous_response_id(d, c):
    first = c.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=4, temperature=0)
    r = httpx.post(d.url + "/v1/responses", headers={"authorization": "Bearer sk-alicealice"}, timeout=60,
                   json={"input": "What is my name?", "previous_response_id": first.id, "max_output_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == first.model
    missing = httpx.post(d.url + "/v1/responses", headers={"authorization": "Bearer sk-alicealice"}, timeout=60,
                         json={"input": "hi", "previous_response_id": "resp_nothere", "max_output_tokens": 2})
    assert missing.status_code == 404


def test_input_items_are_paged(c):
    inp = [{"role": "user", "content": f"note {i}"} for i in range(5)]
    r = c.responses.create(model=MODEL, input=inp, max_output_tokens=2)
    desc = c.responses.input_items.list(r.id)  # newest first, as OpenAI orders them
    assert [i.content[0].text for i in desc.data] == [f"note {i}" for i in range(4, -1, -1)]
    page = c.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["note 0", "note 1"] and page.has_more
    nxt = c.responses.input_items.list(r.id, order="asc", limit=2, after=page.data[-1].id)
    assert [i.content[0].text for i in nxt.data] == ["note 2", "note 3"] and nxt.has_more
    last = c.responses.input_items.list(r.id, order="asc", limit=2, after=nxt.data[-1].id)
    assert [i.content[0].text for i in last.data] == ["note 4"] and not last.has_more
    every = [i.content[0].text for i in c.responses.input_items.list(r.id, order="asc", limit=1)]  # auto-paging
    assert every == [f"note {i}" for i in range(5)]
    for q in ({"limit": 0}, {"limit": 101}, {"order": "up"}, {"after": "msg_nope"}):
        with pytest.raises(openai.BadRequestError):
            c.responses.input_items.list(r.id, extra_query=q)


def test_a_background_response_cut_by_a_restart_reads_as_failed_with_the_logged_output():
    d = Daemon(max_batch=1, max_context=1024)
    try:
        c = client_for(d, "x")
        r = c.responses.create(model=MODEL, input=LONG, background=True, max_output_tokens=900, temperature=0)
        while True:  # some output is in the log
            evs = httpx.get(f"{d.url}/v1/sessions", timeout=10).json()["data"]
            sid = next(s["id"] for s in evs if s["api"] == "responses")
            if len(httpx.get(f"{d.url}/v1/sessions/{sid}/events", timeout=10).json()["data"]) > 8:
                break
            time.sleep(0.05)
    finally:
        d.stop(sig=9)
    d2 = Daemon(max_batch=1, max_context=1024, home=d.home)
    try:
        c2 = client_for(d2, "x")
        got = c2.responses.retrieve(r.id)
        assert got.status == "failed" and got.error.code == "generation_interrupted"
        assert got.output_text  # what the log holds
        evs = list(c2.responses.retrieve(r.id, stream=True))
        assert evs[-1].type == "response.failed"
        with pytest.raises(openai.BadRequestError):
            c2.responses.cancel(r.id)
    finally:
        d2.stop()
