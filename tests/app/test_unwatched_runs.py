"""No request leaves a generation running with nobody reading it (issue 54), in one process
(tests/harness.py). A hosted tool whose `type` holds a character outside Latin-1 made the
x-superfluid-dropped-tools header fail to encode after the job was submitted: the client got
a plain 500 and the generation ran to its end unwatched (a key with max_concurrent 1 filled
every lane that way). Now the header is printable ASCII, built before the submit, and a
handler that raises after the submit, whatever it raised, cancels what it neither streamed
nor collected (api/runner.py: Run, RunsEnd)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from superfluid.api import anthropic, app, responses
from superfluid.api.hosted import HEADER
from superfluid.api.runner import Run

from ..fakes import FakeModel
from ..harness import BASE, MODEL, run

SNOWMAN = "web_search_\u2603"  # not Latin-1: a header of it cannot be encoded
LONG = 400  # tokens: four seconds at 10 ms a step, running while the test looks


def slow() -> FakeModel:
    m = FakeModel(step_delay=0.01)
    m.reply = lambda prompt: m.vocab.script(*["Hello"] * LONG)
    return m


async def running(h) -> int:
    """Generations the engine still runs or queues (/health), once the loop has had its turn."""
    await asyncio.sleep(0.05)
    row = (await h.client.get("/health")).json()["models"][MODEL]
    return row["running"] + row["waiting"]


ROUTES = {
    "responses": ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 3,
                                    "tools": [{"type": SNOWMAN}, {"type": "web_search\n\x01, x"}]}),
    "messages": ("/v1/messages", {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}],
                                  "tools": [{"type": SNOWMAN, "name": "web_search"}]}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_hosted_tool_type_outside_latin_1_gets_a_whole_answer_and_an_ascii_header(route, stream):
    path, body = ROUTES[route]

    async def go(h):
        r = await h.client.post(path, json={**body, "stream": stream})
        return r, await running(h)
    r, left = run(go)
    assert r.status_code == 200, r.text
    value = r.headers[HEADER]
    assert value.isascii() and value.isprintable() and "web_search_\\u2603" in value.split(","), value
    assert (b"Hello" in r.content) if stream else ("Hello" in r.text)
    assert left == 0


def _raise(*a, **kw):
    raise RuntimeError("a fault after the submit")


async def _raise_async(*a, **kw):
    raise RuntimeError("a fault after the submit")


FAULTS = {  # (module, name, replacement, path, body): something a handler calls after Run.submit
    "chat stream": (app, "chat_events", _raise, "/v1/chat/completions",
                    {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}),
    "messages stream": (anthropic, "events", _raise, "/v1/messages",
                        {"model": MODEL, "stream": True, "max_tokens": LONG,
                         "messages": [{"role": "user", "content": "hi"}]}),
    "responses stream": (responses, "events", _raise, "/v1/responses",
                         {"model": MODEL, "stream": True, "input": "hi"}),
    "chat whole": (Run, "collect", _raise_async, "/v1/chat/completions",
                   {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_handler_that_raises_after_the_submit_leaves_no_generation_running(fault, monkeypatch):
    module, name, replacement, path, body = FAULTS[fault]

    async def go(h):
        transport = httpx.ASGITransport(app=h.app.asgi, raise_app_exceptions=False)
        with monkeypatch.context() as mp:
            mp.setattr(module, name, replacement)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
                r = await client.post(path, json=body)
        return r, await running(h), await h.client.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "still there?"}]})
    r, left, after = run(go, slow())
    assert r.status_code == 500
    assert left == 0  # cancelled when the handler exited, not left to run its 400 tokens unread
    assert after.status_code == 200, after.text
