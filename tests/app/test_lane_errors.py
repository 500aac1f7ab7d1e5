"""A request's own error raised in the worker, on the whole real path in one process: the
runtime raises it for one lane (runtime/base.py), it crosses Link W's codec (plan.LaneError),
the scheduler ends that job, the engine re-raises it typed, and the real app (api/app.py,
through httpx's ASGI transport) answers with the status and body it gives the same error
raised in the daemon. A worker fault stays a 500."""

import asyncio

import orjson

from superfluid.errors import BadRequest

from ..fakes import FakeModel
from ..harness import run

REFUSED = BadRequest("this model's vocabulary cannot enforce the schema", param="response_format")


def chat(**kw) -> dict:
    return {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **kw}


def serve(body, refuse: BaseException = REFUSED):
    """The daemon in one process (tests/harness.py) on a fake model whose runtime refuses
    every grammar with `refuse`; `body(client)`'s result and how many runtimes started."""
    m = FakeModel()

    async def go(h):
        def matcher(grammar):
            raise refuse
        m.runtime.grammar_matcher = matcher
        return await body(h.client), len(m.runtimes)
    return run(go, m, ui=False)


def test_the_workers_bad_request_is_the_clients_400_and_other_requests_go_on():
    async def body(client):
        return await asyncio.gather(
            client.post("/v1/chat/completions", json=chat(response_format={"type": "json_object"})),
            client.post("/v1/chat/completions", json=chat()))
    (bad, good), runtimes = serve(body)
    assert bad.status_code == 400
    assert bad.json() == {"error": {"message": REFUSED.message, "type": "invalid_request_error",
                                    "param": "response_format", "code": None}} == REFUSED.body()
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "Hello world."
    assert runtimes == 1  # the worker never restarted


def test_a_stream_ends_with_the_typed_error_event():
    async def body(client):
        return await client.post("/v1/chat/completions",
                                 json=chat(stream=True, response_format={"type": "json_object"}))
    r, _ = serve(body)
    events = [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert r.status_code == 200  # the stream had started: the error is its event
    assert REFUSED.body() in events and events[-1]["choices"][0]["finish_reason"] == "error"


def test_a_worker_fault_stays_a_500():
    async def body(client):
        return await client.post("/v1/chat/completions", json=chat(response_format={"type": "json_object"}))
    r, _ = serve(body, refuse=RuntimeError("the matcher's arena is corrupt"))
    err = r.json()["error"]
    assert r.status_code == 500 and err["type"] == "server_error" and err["code"] == "generation_failed"
    assert "RuntimeError: the matcher's arena is corrupt" in err["message"]
