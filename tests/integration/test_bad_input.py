"""Bad input gets a clear OpenAI-style error and never hurts the daemon."""

import httpx
import pytest

from .conftest import MODEL

OK_MSGS = [{"role": "user", "content": "hi"}]


def post(daemon, path, **kw):
    return httpx.post(daemon.url + path, timeout=60, **kw)


def error_of(r):
    body = r.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]


def test_malformed_json(daemon):
    r = post(daemon, "/v1/chat/completions", content=b'{"model": "x", "messages": [',
             headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "JSON" in error_of(r)["message"]


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL, "messages": "hello"}, "messages"),
    ({"model": MODEL, "messages": OK_MSGS, "max_tokens": "ten"}, "max_tokens"),
    ({"model": MODEL, "messages": OK_MSGS, "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "messages": OK_MSGS, "stream": "yes"}, "stream"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": OK_MSGS, "n": 0}, "n"),
    ({"model": 5, "messages": OK_MSGS}, "model"),
])
def test_wrong_types(daemon, body, param):
    r = post(daemon, "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


def test_body_not_an_object(daemon):
    r = post(daemon, "/v1/chat/completions", json=[1, 2])
    assert r.status_code == 400


def test_missing_or_unknown_model_is_the_default_model(daemon):
    # as llama-server and vLLM: no model is the default model, and with one model served an
    # unknown name is answered by it (--strict-models refuses: test_llama_cli.py)
    for body in ({"messages": OK_MSGS, "max_tokens": 1}, {"model": "gpt-17", "messages": OK_MSGS, "max_tokens": 1}):
        r = post(daemon, "/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["model"] == MODEL, r.text
    assert httpx.get(daemon.url + "/v1/models/gpt-17").status_code == 404  # the catalogue names real models


def test_context_length_exceeded(daemon):
    long = "word " * 1200  # over the test daemon's 1024-token window
    r = post(daemon, "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": long}]})
    assert r.status_code == 400
    assert error_of(r)["code"] == "context_length_exceeded"
    # a max_tokens past the window is capped, not refused (test_agent_requests.py)
    r = post(daemon, "/v1/completions", json={"model": MODEL, "prompt": long, "max_tokens": 4})
    assert error_of(r)["code"] == "context_length_exceeded"


def test_body_too_large(daemon):
    big = b'{"model": "%s", "messages": [{"role": "user", "content": "' % MODEL.encode() + b"a" * (17 << 20) + b'"}]}'
    r = post(daemon, "/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert error_of(r)["code"] == "request_too_large"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/completion", "/api/chat", "/tokenize"])
def test_a_chunked_body_too_large_is_a_413_too(daemon, path):
    """Without a Content-Length the limit is found while the body is read, inside the route: the
    answer is still the 413, not the error page's 500 (found by bench/soak.py --hostile)."""
    def body():
        yield b'{"model": "%s", "prompt": "' % MODEL.encode()
        for _ in range(17):
            yield b"a" * (1 << 20)
        yield b'"}'
    r = post(daemon, path, content=body(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert error_of(r)["code"] == "request_too_large"


def test_the_http_servers_own_lines_go_through_the_daemons_log_writer():
    """uvicorn's lines (a malformed request, an unhandled exception's traceback) go through the
    queued log writer, with the daemon's prefix, not straight to stderr from the event loop: a
    parent that did not read the pipe froze the daemon for good once it was full (soak.py)."""
    import socket

    from .daemon import Daemon
    d = Daemon()
    try:
        with socket.create_connection(("127.0.0.1", d.port)) as s:
            s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            s.recv(1000)
    finally:
        d.stop()
    out = d.proc.stdout.read()
    assert "superfluid: Invalid HTTP request received." in out, out
    assert "WARNING:  Invalid HTTP request" not in out


def test_images_refused(daemon):
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    r = post(daemon, "/v1/chat/completions", json={"model": MODEL, "messages": msgs})
    assert r.status_code == 400
    assert "text only" in error_of(r)["message"]


def test_bad_qos_header(daemon):
    r = post(daemon, "/v1/chat/completions", json={"model": MODEL, "messages": OK_MSGS, "max_tokens": 2},
             headers={"x-superfluid-qos": "vip"})
    assert r.status_code == 400


def test_unknown_route_and_bad_tokens(daemon):
    r = httpx.get(daemon.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = post(daemon, "/detokenize", json={"tokens": [10 ** 9]})
    assert r.status_code == 400
    r = post(daemon, "/v1/completions", json={"model": MODEL, "prompt": [10 ** 9], "max_tokens": 2})
    assert r.status_code == 400


def test_still_serving_after_bad_input(daemon):
    r = post(daemon, "/v1/chat/completions", json={"model": MODEL, "messages": OK_MSGS, "max_tokens": 3})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] >= 1


def _deep(n: int) -> dict:
    schema: dict = {"type": "object", "properties": {}}
    cur = schema
    for _ in range(n):
        cur["properties"]["x"] = {"type": "object", "properties": {}}
        cur = cur["properties"]["x"]
    return schema


LIMITS = [  # (what goes over, the parameter the 400 names)
    ("messages", [{"role": "user", "content": "hi"}] * 5000, "messages"),
    ("stop", [f"s{i}" for i in range(17)], "stop"),
    ("tools", [{"name": "f", "description": "", "parameters": _deep(40)}], "tools"),
]


@pytest.mark.parametrize("what,value,param", LIMITS, ids=[x[0] for x in LIMITS])
def test_limits_are_typed_400s_naming_the_parameter_on_every_api(daemon, what, value, param):
    """docs/security.md's limits, the same on OpenAI, Anthropic, Ollama and Responses."""
    msgs = value if what == "messages" else OK_MSGS
    fn = {"type": "function", "function": {**value[0]}} if what == "tools" else None
    bodies = {
        "/v1/chat/completions": {"model": MODEL, "messages": msgs, "max_tokens": 2,
                                 **({"stop": value} if what == "stop" else {}), **({"tools": [fn]} if fn else {})},
        "/v1/messages": {"model": MODEL, "messages": msgs, "max_tokens": 2,
                         **({"stop_sequences": value} if what == "stop" else {}),
                         **({"tools": [{"name": "f", "input_schema": value[0]["parameters"]}]} if fn else {})},
        "/api/chat": {"model": MODEL, "messages": msgs, "stream": False,
                      **({"options": {"stop": value}} if what == "stop" else {}), **({"tools": [fn]} if fn else {})},
    }
    if what != "stop":  # Responses has no stop strings
        bodies["/v1/responses"] = {"model": MODEL, "input": msgs, "max_output_tokens": 2,
                                   **({"tools": [{"type": "function", **value[0]}]} if fn else {})}
    for path, body in bodies.items():
        r = post(daemon, path, json=body)
        assert r.status_code == 400, (path, r.status_code, r.text[:200])
        err = r.json().get("error")
        message = err["message"] if isinstance(err, dict) else err
        assert param in r.text and message, (path, r.text[:200])
    ok = post(daemon, "/v1/chat/completions", json={"model": MODEL, "messages": OK_MSGS, "max_tokens": 2})
    assert ok.status_code == 200  # nothing else is affected


def test_metrics_label_requests_by_route_never_by_a_made_up_path(daemon):
    """An unknown path is never a label value of its own: each would be a new series, memory
    that grows with every path a client makes up."""
    for i in range(5):
        httpx.get(f"{daemon.url}/no/such/path/{i}", timeout=10)
        httpx.get(f"{daemon.url}/v1/sessions/sess-nope{i}", timeout=10)
    text = httpx.get(daemon.url + "/metrics", timeout=10).text
    lines = [ln for ln in text.splitlines() if ln.startswith("superfluid_requests_total{")]
    assert not any("/no/such/path" in ln or "sess-nope" in ln for ln in lines)
    assert any('path="unmatched"' in ln for ln in lines)
    assert any('path="/v1/sessions/{sid}"' in ln for ln in lines)


def test_a_stdout_nobody_reads_never_freezes_the_daemon():
    """A thread writes the log lines, never the event loop: with stdout a pipe nobody reads
    (as here), about 64 KiB of access lines (a few requests with long paths) would block a
    write on the loop and freeze the daemon, even /health. Paths are logged up to 256
    characters."""
    from .daemon import Daemon
    d = Daemon(max_batch=1, max_context=256)  # its stdout: a pipe this test never reads
    try:
        with httpx.Client(base_url=d.url, timeout=10) as c:
            for i in range(250):  # ~75 KB of access lines, more than the pipe holds
                c.get(f"/{'a' * 4000}{i}")
            assert c.get("/health").status_code == 200
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": OK_MSGS, "max_tokens": 2})
            assert r.status_code == 200
    finally:
        d.stop()
