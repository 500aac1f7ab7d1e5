"""API keys, key policies, browser-borne requests: against a real daemon."""

import json
import subprocess
import sys

import httpx
import openai
import pytest

from .conftest import MODEL
from .daemon import Daemon, free_port

POLICY = {"keys": [
    {"name": "bg", "key": "sk-bgbgbgbg", "qos": "background", "max_qos": "agent", "rpm": 3},
    {"name": "one", "key": "sk-oneoneon", "max_concurrent": 1},
    {"name": "alice", "key": "sk-alicealice"},
    {"name": "bob", "key": "sk-bobbobbob"},
]}
BODY = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    p = tmp_path_factory.mktemp("policy") / "keys.json"
    p.write_text(json.dumps(POLICY))
    daemon = Daemon("--api-key", "sk-admin-key", "--key-policy", str(p), "--allow-model-paths", "--strict-models",
                    max_batch=2, max_context=512)
    yield daemon
    daemon.stop()


def post(d, headers=None, body=BODY):
    return httpx.post(d.url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=60)


def test_key_required_but_not_for_health(d):
    assert post(d).status_code == 401
    assert post(d, {"authorization": "Bearer nope-nope-nope"}).json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(d.url + "/health").status_code == 200
    assert httpx.get(d.url + "/health").json() == {"status": "ok"}  # no key: no paths, pids or models
    full = httpx.get(d.url + "/health", headers={"x-api-key": "sk-oneoneon"}).json()
    assert full["status"] == "ok" and MODEL in full["models"]
    assert httpx.get(d.url + "/v1/models").status_code == 401


def test_openai_client_with_the_key(d):
    c = openai.OpenAI(base_url=d.url + "/v1", api_key="sk-admin-key", max_retries=0)
    r = c.chat.completions.create(**BODY)
    assert r.choices[0].message.content is not None
    bad = openai.OpenAI(base_url=d.url + "/v1", api_key="sk-wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_policy_class_ceiling_and_rate(d):
    h = {"x-api-key": "sk-bgbgbgbg"}
    r = post(d, {**h, "x-superfluid-qos": "interactive"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "qos_not_allowed"
    codes = [post(d, h).status_code for _ in range(3)]
    assert codes == [200, 200, 200]  # a refused class does not use up the rate
    r = post(d, h)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1


def test_concurrency_limit_counts_a_running_stream(d):
    h = {"x-api-key": "sk-oneoneon"}
    body = {**BODY, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, headers=h, timeout=60) as r:
        lines = r.iter_lines()  # keep the iterator: dropping it closes the connection
        assert r.status_code == 200 and next(lines).startswith("data: ")
        second = post(d, h)
        assert second.status_code == 429
        assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
    assert post(d, h).status_code == 200


def test_a_page_needs_the_key_and_a_rebound_host_or_null_origin_is_refused(d):
    # With keys and no --cors-origins any page may ask, as llama-server's default: the key is
    # never ambient, so a foreign page without it gets a 401, not the model.
    h = {"authorization": "Bearer sk-admin-key"}
    assert post(d, {"origin": "https://evil.example"}).status_code == 401
    assert post(d, {**h, "origin": "https://evil.example"}).status_code == 200
    assert post(d, {**h, "origin": "http://localhost:5173"}).status_code == 200
    assert post(d, {**h, "origin": "null"}).status_code == 403
    assert post(d, {**h, "host": "attacker.example"}).status_code == 403


def test_bad_policy_file_exits_2(tmp_path):
    p = tmp_path / "k.json"
    p.write_text(json.dumps({"keys": [{"name": "a", "key": "sk-12345678", "oops": 1}]}))
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", "--key-policy", str(p),
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "unknown fields" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_model_admin_needs_an_admin_key(d):
    body = {"model": MODEL}
    r = httpx.post(d.url + "/v1/models/load", json=body, headers={"x-api-key": "sk-oneoneon"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = httpx.post(d.url + "/v1/models/load", json=body, headers={"x-api-key": "sk-admin-key"}, timeout=60)
    assert r.status_code == 200


def test_an_admin_loads_a_model_by_path_with_allow_model_paths(d, tmp_path):
    import os

    from superfluid.runtime.registry import embedded_model
    admin, other = {"x-api-key": "sk-admin-key"}, {"x-api-key": "sk-alicealice"}
    path = tmp_path / "gamma.gguf"
    os.symlink(embedded_model().path, path)
    assert httpx.post(d.url + "/v1/models/load", json={"model": str(path)}, headers=other).status_code == 403
    r = httpx.post(d.url + "/v1/models/load", json={"model": str(path)}, headers=admin, timeout=120)
    assert r.status_code == 200 and r.json()["id"] == "gamma" and r.json()["meta"]["loaded"]
    assert post(d, admin, {**BODY, "model": "gamma"}).status_code == 200
    r = httpx.delete(d.url + "/v1/models/gamma", headers=admin, timeout=60)
    assert r.status_code == 200 and r.json()["deleted"]
    assert post(d, admin, {**BODY, "model": "gamma"}).status_code == 404
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    r = httpx.post(d.url + "/v1/models/load", json={"model": str(bad)}, headers=admin)
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_load_error"


def test_keys_own_their_sessions_and_stored_responses(d):
    """Every request is a session: another key cannot list, read, resume, fork, pin or purge
    it, nor read a stored response or chain from it (404, as if it did not exist); the admin
    key sees all."""
    alice, bob, admin = ({"authorization": f"Bearer {k}"} for k in ("sk-alicealice", "sk-bobbobbob", "sk-admin-key"))
    r = post(d, alice)
    assert r.status_code == 200
    sid = r.headers["x-superfluid-session"]
    assert httpx.get(f"{d.url}/v1/sessions/{sid}", headers=alice).json()["owner"] == "alice"
    for method, path in (("GET", ""), ("GET", "/events"), ("GET", "/resume"), ("POST", "/fork"),
                         ("POST", "/pin"), ("POST", "/cancel"), ("PATCH", ""), ("DELETE", "")):
        r = httpx.request(method, f"{d.url}/v1/sessions/{sid}{path}", headers=bob, timeout=30,
                          json={"title": "mine"} if method == "PATCH" else None)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
    listed = lambda h: [s["id"] for s in httpx.get(f"{d.url}/v1/sessions", headers=h).json()["data"]]  # noqa: E731
    assert sid in listed(alice) and sid not in listed(bob) and sid in listed(admin)
    assert httpx.get(f"{d.url}/v1/sessions/{sid}/events", headers=admin).status_code == 200
    assert httpx.get(f"{d.url}/v1/sessions/{sid}/events", headers=alice).status_code == 200
    # stored responses too
    resp = httpx.post(f"{d.url}/v1/responses", headers=alice, timeout=60,
                      json={"model": MODEL, "input": "hi", "max_output_tokens": 2}).json()
    assert httpx.get(f"{d.url}/v1/responses/{resp['id']}", headers=alice).status_code == 200
    assert httpx.get(f"{d.url}/v1/responses/{resp['id']}", headers=bob).status_code == 404
    assert httpx.get(f"{d.url}/v1/responses/{resp['id']}/input_items", headers=bob).status_code == 404
    chained = httpx.post(f"{d.url}/v1/responses", headers=bob, timeout=60, json={
        "model": MODEL, "input": "and?", "max_output_tokens": 2, "previous_response_id": resp["id"]})
    assert chained.status_code == 404
    assert httpx.delete(f"{d.url}/v1/responses/{resp['id']}", headers=bob).status_code == 404
    assert httpx.get(f"{d.url}/v1/responses/{resp['id']}", headers=admin).status_code == 200
