"""The access log, through the whole daemon in one process (tests/harness.py): one JSON line
per request with the model, class, token counts and timings for every API that generates,
and never the content of a prompt or an output."""

from ..harness import MODEL, run

SECRET = "The password is swordfish-42"
MSG = [{"role": "user", "content": SECRET}]
APIS = [  # path, body (model added): each asks 3 tokens of a 4-token reply
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 3, "stream": True}),
    ("/v1/completions", {"prompt": SECRET, "max_tokens": 3}),
    ("/v1/messages", {"messages": MSG, "max_tokens": 3}),
    ("/v1/messages", {"messages": MSG, "max_tokens": 3, "stream": True}),
    ("/v1/responses", {"input": SECRET, "max_output_tokens": 3}),
    ("/api/chat", {"messages": MSG, "stream": False, "options": {"num_predict": 3}}),
    ("/api/generate", {"prompt": SECRET, "stream": False, "options": {"num_predict": 3}}),
    ("/completion", {"prompt": SECRET, "n_predict": 3}),
]


def sid_of(recs: list[dict]) -> str:
    (r,) = [r for r in recs if r["path"].startswith("/v1/sessions/") and r["path"].endswith("/generate")]
    return r["path"].split("/")[3]


def test_every_api_that_generates_logs_model_class_tokens_and_timings():
    async def body(h):
        c = h.client
        for path, b in APIS:
            r = await c.post(path, json={**b, "model": MODEL})
            assert r.status_code == 200, (path, r.text)
        sid = (await c.post("/v1/sessions", json={"model": MODEL})).json()["id"]
        await c.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": SECRET})
        assert (await c.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 3})).status_code == 200
        assert (await c.post("/v1/chat/completions", json={"model": "nope", "messages": MSG})).status_code == 404
        await c.get("/health")
        return h.access
    recs = run(body, strict_models=True)
    assert SECRET not in str(recs) and "swordfish" not in str(recs)
    assert not [r for r in recs if r["path"] == "/health"]
    gen = [r for r in recs if r["status"] == 200 and not r["path"].endswith(f"{sid_of(recs)}/messages")]
    assert [r["path"] for r in gen] == [p for p, _ in APIS] + [gen[-1]["path"]]
    assert gen[-1]["path"].startswith("/v1/sessions/") and gen[-1]["path"].endswith("/generate")
    for r in gen:
        assert r["model"] == MODEL and r["qos"] == "agent", r
        assert r["prompt_tokens"] > 5 and r["completion_tokens"] == 3 and r["finish"] == "length", r
        assert r["cached_tokens"] >= 0 and 0 < r["ttft_s"] <= r["total_s"], r
        assert r["prefill_tps"] > 0 and r["decode_tps"] > 0, r
    (missing,) = [r for r in recs if r["status"] == 404]
    assert missing["path"] == "/v1/chat/completions" and missing["error"] == "model_not_found"
