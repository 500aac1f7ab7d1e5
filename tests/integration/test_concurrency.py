"""Many streams at once, and a client that goes away."""

import asyncio
import time

import httpx
import openai

from .conftest import MODEL


def _running(daemon) -> int:
    return next(iter(daemon.health()["models"].values()))["running"]


def test_eight_concurrent_streams_complete(daemon):
    async def one(ac, i):
        s = await ac.chat.completions.create(model=MODEL, max_tokens=12 + i, temperature=0, stream=True,
                                             messages=[{"role": "user", "content": f"Tell me fact number {i}."}])
        text, finish = "", None
        async for c in s:
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
        return text, finish

    async def main():
        ac = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key="x", max_retries=0, timeout=120)
        out = await asyncio.gather(*(one(ac, i) for i in range(8)))
        await ac.close()
        return out

    results = asyncio.run(main())
    assert len(results) == 8
    for text, finish in results:
        assert text and finish in ("stop", "length")


def _served(daemon) -> float:
    """Chat requests whose response the daemon has finished (its access log's counter)."""
    text = httpx.get(daemon.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('superfluid_requests_total{path="/v1/chat/completions"'))


def _tokens(daemon, sid: str) -> int:
    return httpx.get(f"{daemon.url}/v1/sessions/{sid}", timeout=10).json()["tokens"]


def _wait_idle(daemon, timeout=20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = _running(daemon)
        if n == 0:
            return 0
        time.sleep(0.1)
    return _running(daemon)


def test_disconnect_frees_the_lane(daemon):
    body = {"model": MODEL, "max_tokens": 900, "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a very long essay."}]}
    served = _served(daemon)
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=60) as r:
        sid = r.headers["x-superfluid-session"]
        lines = r.iter_lines()  # read a few events but keep the connection open
        got = 0
        while got < 5:
            got += next(lines).startswith("data: ")
        assert _running(daemon) == 1
        r.close()
    # the client hung up long before 900 tokens: once the daemon has seen it go (its response
    # ended), the generation is cut at once (finish "dropped"), its lane freed for others;
    # a resume would continue it from the log
    deadline = time.monotonic() + 10
    while _served(daemon) == served and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _served(daemon) > served
    assert _wait_idle(daemon, timeout=30) == 0
    log = httpx.get(f"{daemon.url}/v1/sessions/{sid}/events", timeout=10).json()["data"]
    assert log[-1]["type"] == "generated" and log[-1]["finish"] == "dropped"
    info = httpx.get(f"{daemon.url}/v1/sessions/{sid}", timeout=10).json()
    assert not info["busy"] and info["turn_open"]
    cut_at = _tokens(daemon, sid)
    assert _tokens(daemon, sid) == cut_at and sum(len(e.get("span") or []) for e in log
                                                   if e["type"] == "generated") < 900  # nothing generates on


def test_non_streaming_disconnect_frees_the_lane(daemon):
    body = {"model": MODEL, "max_tokens": 900, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a very long essay."}]}
    try:
        httpx.post(daemon.url + "/v1/chat/completions", json=body, timeout=1.5)
    except httpx.ReadTimeout:
        pass
    assert _wait_idle(daemon) == 0
