"""kill -9 of the worker: in-flight requests get a typed error, the worker comes back, the
next request is served. Uses its own daemon: it breaks things on purpose."""

import json
import os
import signal
import time

import httpx
import pytest

from .conftest import MODEL
from .daemon import Daemon, pid_alive

LONG = {"model": MODEL, "max_tokens": 800, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Write a very long essay about rivers."}]}


@pytest.fixture(scope="module")
def d():
    daemon = Daemon()
    yield daemon
    daemon.stop()


def _wait_new_worker(d, old_pid, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = d.health()
        pid = next(iter(h["models"].values()))["worker_pid"]
        if pid and pid != old_pid and h["status"] == "ok":
            return pid
        time.sleep(0.2)
    raise AssertionError("no new worker")


def decoded(d) -> float:
    """Tokens the daemon's scheduler has decoded (its /metrics counter)."""
    for line in httpx.get(d.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("superfluid_decode_tokens_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_streaming_request_gets_error_event_then_done(d):
    pid = d.worker_pid()
    with httpx.stream("POST", d.url + "/v1/chat/completions", json={**LONG, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        got = 0
        while got < 3:
            got += next(lines).startswith("data: ")
        os.kill(pid, signal.SIGKILL)
        rest = [ln for ln in lines if ln.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    errors = [json.loads(ln[6:]) for ln in rest[:-1] if '"error"' in ln]
    assert errors and errors[0]["error"]["code"] == "worker_crashed"
    new = _wait_new_worker(d, pid)
    assert not pid_alive(pid) and pid_alive(new)
    r = httpx.post(d.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_non_streaming_request_gets_500_then_served(d):
    import threading
    pid = d.worker_pid()
    before = decoded(d)
    out = {}

    def call():
        out["r"] = httpx.post(d.url + "/v1/chat/completions", json=LONG, timeout=60)

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 30
    while next(iter(d.health()["models"].values()))["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    # it has generated tokens, not just been admitted: decodes are counted as they are planned,
    # two plans ahead of their results, and a request that produced nothing yet is retried on
    # the next worker instead of failing
    while decoded(d) <= before + 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    r = out["r"]
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "worker_crashed"
    r = httpx.post(d.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200


def test_worker_killed_while_idle_is_replaced_transparently(d):
    pid = d.worker_pid()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(pid)  # the worker is gone before the request comes
    r = httpx.post(d.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    assert d.worker_pid() != pid


def test_respawn_gives_up_after_three_failures_until_the_next_request(tmp_path):
    """The model file goes bad under a running daemon: respawns fail, it stops retrying with
    a clear log line, requests get 503 worker_unavailable; once the file is back, the next
    request brings the worker back."""
    import shutil

    from superfluid.runtime.registry import embedded_model
    good = embedded_model().path
    path = tmp_path / "model.gguf"
    shutil.copy(good, path)
    d = Daemon(str(path), max_batch=2, max_context=512)
    try:
        with open(good, "rb") as f:
            head = f.read(8 << 20)  # metadata intact, tensor data cut off
        path.write_bytes(head)
        os.kill(d.worker_pid(), signal.SIGKILL)
        body = {"model": "model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "worker_unavailable"
        assert httpx.get(d.url + "/health", timeout=10).status_code == 503
        shutil.copy(good, path)
        r = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200
        assert httpx.get(d.url + "/health", timeout=10).status_code == 200
    finally:
        d.stop()
    log = d.proc.stdout.read()
    assert "not restarting it until the next request" in log


def test_a_worker_gets_its_settings_in_hello_and_reports_why_it_cannot_load():
    """Link W end to end without a model: the worker process reads its settings from the
    daemon's HELLO (nothing on its command line but the socket) and answers ERROR with the
    reason, which the supervisor raises as a typed WorkerCrashed."""
    import asyncio

    from superfluid.errors import WorkerCrashed
    from superfluid.worker.protocol import WorkerSettings
    from superfluid.worker.supervisor import WorkerProcess

    async def start() -> str:
        w = WorkerProcess(WorkerSettings("/nonexistent.gguf", 1, 64, 1, 16, runtime="no-such-runtime",
                                         load_timeout_s=60))
        with pytest.raises(WorkerCrashed) as e:
            await w.start()
        await w.stop()
        assert not w.alive and e.value.code == "worker_crashed"  # no code of its own: the default
        return e.value.message
    assert "unknown runtime no-such-runtime" in asyncio.run(start())


def test_the_worker_runs_its_threads_waiting_passively(d):
    """The worker's environment holds OMP_WAIT_POLICY=PASSIVE (its OpenMP threads sleep at a
    barrier: with every core in use, a spinning thread would stall behind a busy core)."""
    with open(f"/proc/{d.worker_pid()}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    assert env.get(b"OMP_WAIT_POLICY") == b"PASSIVE"
