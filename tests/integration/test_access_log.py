"""The access log of a real daemon: one JSON line per request, counts and timings, no content."""

import json

import httpx

from .conftest import MODEL
from .daemon import Daemon

SECRET = "The password is swordfish-42"


def test_access_log_lines():
    d = Daemon("--log-format", "json", "--strict-models", max_batch=2, max_context=512)
    try:
        body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": SECRET}]}
        assert httpx.post(d.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        with httpx.stream("POST", d.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
            list(r.iter_lines())
        assert httpx.post(d.url + "/v1/chat/completions", json={**body, "model": "nope"}).status_code == 404
        httpx.get(d.url + "/health")
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
