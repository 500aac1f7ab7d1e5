"""The access log of a real daemon: one JSON line per request, counts and timings, no content."""

import json

import httpx

from .conftest import MODEL
from .daemon import Daemon

SECRET = "The password is swordfish-42"
MSG = [{"role": "user", "content": SECRET}]
OTHER_APIS = [  # path, body (model added): each asks 5 tokens
    ("/v1/completions", {"prompt": SECRET, "max_tokens": 5}),
    ("/v1/messages", {"messages": MSG, "max_tokens": 5}),
    ("/v1/responses", {"input": SECRET, "max_output_tokens": 5}),
    ("/api/chat", {"messages": MSG, "stream": False, "options": {"num_predict": 5}}),
    ("/api/generate", {"prompt": SECRET, "stream": False, "options": {"num_predict": 5}}),
    ("/completion", {"prompt": SECRET, "n_predict": 5}),
]


def test_access_log_lines():
    d = Daemon("--log-format", "json", "--strict-models", max_batch=2, max_context=512)
    try:
        body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": SECRET}]}
        assert httpx.post(d.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        with httpx.stream("POST", d.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
            list(r.iter_lines())
        assert httpx.post(d.url + "/v1/chat/completions", json={**body, "model": "nope"}).status_code == 404
        httpx.get(d.url + "/health")
        for path, b in OTHER_APIS:
            r = httpx.post(d.url + path, json={**b, "model": MODEL}, timeout=60)
            assert r.status_code == 200, (path, r.text)
        with httpx.stream("POST", d.url + "/v1/messages", json={**OTHER_APIS[1][1], "model": MODEL, "stream": True},
                          timeout=60) as r:
            list(r.iter_lines())
        sid = httpx.post(d.url + "/v1/sessions", json={"model": MODEL}).json()["id"]
        httpx.post(f"{d.url}/v1/sessions/{sid}/messages", json={"role": "user", "content": SECRET})
        assert httpx.post(f"{d.url}/v1/sessions/{sid}/generate", json={"max_tokens": 5}, timeout=60).status_code == 200
    finally:
        d.stop()
    out = d.proc.stdout.read()
    assert SECRET not in out and "swordfish" not in out
    recs = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{") and '"path"' in ln]
    chat = [r for r in recs if r["path"] == "/v1/chat/completions"]
    assert [r["status"] for r in chat] == [200, 200, 404]
    for r in chat[:2]:
        assert r["model"] == MODEL and r["qos"] == "agent" and r["method"] == "POST"
        assert r["prompt_tokens"] > 10 and r["completion_tokens"] == 5 and r["finish"] == "length"
        assert 0 < r["ttft_s"] <= r["total_s"] and r["prefill_tps"] > 0 and r["decode_tps"] > 0
        assert "cached_tokens" in r
    assert not [r for r in recs if r["path"] == "/health"]
    # every API that generates fills the same fields (Service.submit fills them, whatever the API)
    paths = [p for p, _ in OTHER_APIS] + ["/v1/messages", "/v1/sessions/{sid}/generate"]
    gen = [r for r in recs if r["path"] in paths or r["path"].endswith("/generate") and r["path"].startswith("/v1/s")]
    assert len(gen) == len(paths)
    for r in gen:
        assert r["model"] == MODEL and r["qos"] == "agent" and r["status"] == 200, r
        assert r["prompt_tokens"] > 5 and r["completion_tokens"] == 5 and r["finish"] == "length", r
        assert 0 < r["ttft_s"] <= r["total_s"] and "cached_tokens" in r, r
