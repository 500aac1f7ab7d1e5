"""Loading a model never stalls the daemon's event loop (issue 54): building an engine reads
the model file (llama.cpp's vocabulary, the GGUF's template: 0.2 s for SmolLM2's 49k tokens),
which ran on the loop, so /health and every stream waited for it. Now it runs in a thread:
/health answers within 100 ms all through a load."""

from __future__ import annotations

import asyncio
import time

from superfluid.daemon import tokenizer_for
from superfluid.runtime.registry import ModelSource, embedded_model

from ..fakes import FakeModel
from ..harness import run

BOUND_S = 0.1  # the bound; a load without the fix stalls the loop 0.2 s or more


def test_health_and_the_loop_never_wait_on_a_model_load():
    m = FakeModel()
    fake = m.factory()
    parsed: list[float] = []

    def factory(ec, log, hooks, clock):  # what daemon.build_engine does first: the model file, read
        t0 = time.monotonic()
        tokenizer_for(embedded_model().path)
        parsed.append(time.monotonic() - t0)
        return fake(ec, log, hooks, clock)

    async def body(h):
        h.app.models._build = lambda ec: factory(ec, h.app.sessions, h.app.metrics.hooks(ec.model_id), h.clock)
        h.app.models.add(ModelSource("fake.gguf", "second"))
        load = asyncio.create_task(h.client.post("/v1/models/load", json={"model": "second"}))
        health: list[float] = []
        lag: list[float] = []
        while not load.done():
            t0 = time.monotonic()
            await asyncio.sleep(0.005)
            lag.append(time.monotonic() - t0 - 0.005)
            t0 = time.monotonic()
            r = await h.client.get("/health")
            health.append(time.monotonic() - t0)
            assert r.status_code == 200
        assert (await load).status_code == 200, (await load).text
        return health, lag
    health, lag = run(body, m)
    assert parsed and parsed[0] > 0.05, parsed  # the load did read the file, for a while
    assert max(health) < BOUND_S and max(lag) < BOUND_S, (max(health), max(lag), parsed)
    assert len(health) >= 3, health  # /health was asked all through the load
