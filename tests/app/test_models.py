"""Several models in one process (tests/harness.py): a non-default model idle past
--idle-timeout is unloaded and the default never is, on the daemon's clock advanced by the
test instead of slept through; the next request loads it again."""

from superfluid.runtime.registry import ModelSource

from ..harness import MODEL, run

ALPHA = ModelSource("alpha.gguf", "alpha")


def chat(c, model: str):
    return c.post("/v1/chat/completions", json={"model": model, "max_tokens": 3,
                                                 "messages": [{"role": "user", "content": "hi"}]})


async def loaded(c) -> dict[str, bool]:
    return {m["id"]: m["meta"]["loaded"] for m in (await c.get("/v1/models")).json()["data"]}


def test_idle_models_are_unloaded_on_the_clock_but_never_the_default():
    async def body(h):
        c, models = h.client, h.app.models
        out = {"before": await loaded(c)}
        assert (await chat(c, "alpha")).status_code == 200 and (await chat(c, MODEL)).status_code == 200
        out["used"] = await loaded(c)
        h.clock.advance(2.0)  # under the timeout
        out["early"] = await models.reap()
        h.clock.advance(1.5)
        out["reaped"] = await models.reap()
        out["after"] = await loaded(c)
        h.clock.advance(3600)
        out["default"] = await models.reap()
        assert (await chat(c, "alpha")).status_code == 200
        out["again"] = await loaded(c)
        return out
    out = run(body, models=(ModelSource("fake.gguf", MODEL), ALPHA), idle_timeout=3.0)
    assert out["before"] == {MODEL: True, "alpha": True}  # a --model loads at start
    assert out["used"] == {MODEL: True, "alpha": True}
    assert out["early"] == [] and out["reaped"] == ["alpha"] and out["default"] == []
    assert out["after"] == {MODEL: True, "alpha": False}
    assert out["again"] == {MODEL: True, "alpha": True}
