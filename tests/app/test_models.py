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


async def unload(c, model: str, headers=None):
    r = await c.post("/v1/models/unload", json={"model": model}, headers=headers or {})
    assert r.status_code == 200, r.text


def test_a_get_never_loads_a_model_and_a_post_does():
    """Issue 33: a web page's GET (or anyone's) must not load models; a generation does."""
    async def body(h):
        c = h.client
        await unload(c, "alpha")
        out = {"props": await c.get("/props", params={"model": "alpha"}),
               "slots": await c.get("/slots", params={"model": "alpha"})}
        out["still"] = await loaded(c)
        out["chat"] = await chat(c, "alpha")
        out["now"] = await loaded(c)
        return out
    out = run(body, models=(ModelSource("fake.gguf", MODEL), ALPHA))
    for k in ("props", "slots"):
        assert out[k].status_code == 403, (k, out[k].text)
        assert "never loads" in out[k].json()["error"]["message"]  # llama-server's error shape
    assert out["still"]["alpha"] is False
    assert out["chat"].status_code == 200 and out["now"]["alpha"] is True


def test_with_keys_only_an_admin_key_loads_a_model():
    from superfluid.api.policy import KeyPolicy
    user, admin = {"authorization": "Bearer sk-user-user"}, {"authorization": "Bearer sk-admin-admin"}

    async def body(h):
        c = h.client
        await unload(c, "alpha", admin)
        user_try = await c.post("/v1/chat/completions", headers=user, json={
            "model": "alpha", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        user_default = await c.post("/v1/chat/completions", headers=user, json={
            "model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        admin_try = await c.post("/v1/chat/completions", headers=admin, json={
            "model": "alpha", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        user_again = await c.post("/v1/chat/completions", headers=user, json={
            "model": "alpha", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        return user_try, user_default, admin_try, user_again
    user_try, user_default, admin_try, user_again = run(
        body, models=(ModelSource("fake.gguf", MODEL), ALPHA),
        policies=(KeyPolicy("user", "sk-user-user"), KeyPolicy("root", "sk-admin-admin", admin=True)))
    assert user_try.status_code == 403 and "only an admin key may load" in user_try.json()["error"]["message"]
    assert user_default.status_code == 200  # loaded models serve every key
    assert admin_try.status_code == 200 and user_again.status_code == 200  # once loaded, it serves everyone
