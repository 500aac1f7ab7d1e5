"""Pull the plug: SIGKILL the daemon mid-generation, restart it on the same sessions
directory, and check nothing acknowledged was lost or duplicated. Also: a second daemon and
an unreadable store are refused at start, and a throwaway store keeps nothing."""

import os
import signal
import subprocess
import sys
import time

import pytest

from superfluid.client import Client

from .daemon import Daemon

PROMPT = "Write a long story about a lighthouse keeper and a storm."
BUDGET = 60


def _session(c: Client) -> str:
    s = c.create(system="Be brief.", temperature=0)
    c.append(s["id"], "user", PROMPT)
    return s["id"]


def _generated(c: Client, sid: str) -> list[dict]:
    return [e for e in c.events(sid) if e["type"] == "generated"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return str(tmp_path_factory.mktemp("crash-home"))


@pytest.fixture(scope="module")
def reference(daemon):
    """The uncut turn, from the suite's shared daemon (the same settings, another home)."""
    with Client(daemon.url) as c:
        sid = _session(c)
        out = c.generate(sid, max_tokens=BUDGET)
        assert out["finish"] == "length"  # the story is longer than the budget: every kill point is mid-stream
        return out["text"]


@pytest.mark.parametrize("kill_after", [1, 7, 30])
def test_sigkill_mid_stream_loses_nothing(home, reference, kill_after):
    d = Daemon(home=home)
    with Client(d.url) as c:
        epoch_before = c.create(temperature=0)["epoch"]
        sid = _session(c)
        seen, last, got = [], None, 0
        for ev in c.stream(sid, max_tokens=BUDGET):
            seen.append(ev["text"])
            last = ev["id"]
            got += len(ev.get("tokens") or ())  # an event holds the tokens of one flush (--stream-interval-ms)
            if got >= kill_after:
                os.kill(d.proc.pid, signal.SIGKILL)
                break
    d.proc.wait(10)
    d = Daemon(home=home)  # the same sessions directory
    try:
        with Client(d.url) as c:
            info = c.get(sid)
            assert info["epoch"] > epoch_before  # the restart fenced the old owner
            assert not info["busy"] and info["turn_open"]
            gen = _generated(c, sid)
            committed = "".join(e["text"] for e in gen)
            assert committed.startswith("".join(seen))  # everything the client saw was committed first
            assert sum(len(e["span"]) for e in gen) >= kill_after
            assert c.events(sid)[-1]["type"] == "epoch_bump"
            # the dropped stream resumes from the log: the committed rest, then the interruption
            resumed = list(c.resume(sid, after=last))
            rest = "".join(e.get("text", "") for _, e in resumed if e.get("type") == "generated")
            assert "".join(seen) + rest == committed
            assert resumed[-1][1]["type"] == "interrupted"
            # continuing the session finishes the turn exactly as if nothing had happened
            n_tokens = sum(len(e["span"]) for e in gen)
            cont = c.generate(sid, max_tokens=BUDGET - n_tokens)
            assert committed + cont["text"] == reference
    finally:
        d.stop()


def _serve(home: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", "--port", "0", "--threads", "1",
                           "--max-context", "512", *extra], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SUPERFLUID_HOME": home})


def test_a_second_daemon_on_the_same_sessions_is_refused(tmp_path):
    d = Daemon(home=str(tmp_path))
    try:
        t0 = time.monotonic()
        r = _serve(str(tmp_path))
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "sessions directory" in lines[0] and str(tmp_path) in lines[0]
        assert time.monotonic() - t0 < 30  # refused before loading anything
        assert d.health()["status"] == "ok"  # the first one is untouched
    finally:
        d.stop()


def test_an_unreadable_store_is_refused_and_left_alone(tmp_path):
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    junk = os.urandom(8192)
    (sessions / "sessions.db").write_bytes(junk)
    r = _serve(str(tmp_path))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(sessions / "sessions.db") in lines[0]
    assert (sessions / "sessions.db").read_bytes() == junk


def test_a_throwaway_store_keeps_nothing(tmp_path):
    d = Daemon("--sessions-cache", home=str(tmp_path))
    try:
        with Client(d.url) as c:
            sid = _session(c)
            assert c.generate(sid, max_tokens=4)["text"]
            assert len(c.events(sid)) > 3
    finally:
        d.stop()
    assert not (tmp_path / "sessions" / "sessions.db").exists()
    d = Daemon("--sessions-cache", home=str(tmp_path))
    try:
        with Client(d.url) as c:
            assert c.list() == []
    finally:
        d.stop()


def test_a_resumed_stream_of_a_cut_request_finishes_the_generation(tmp_path):
    """A chat completion streamed when the daemon died: reconnecting with Last-Event-ID
    after the restart gives the committed rest, then the daemon generates the remainder of
    the request's budget; greedy, seen + resumed == an uninterrupted run. With
    --deterministic: the remainder's prompt (the turn's earlier output too) is computed after
    the restart in other runs than the first time, which flips near ties otherwise (on this
    machine's AMD EPYC the uninterrupted run and the resumed one parted after 251 characters)."""
    import httpx

    from superfluid.client import iter_sse
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": BUDGET, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}]}
    d = Daemon("--deterministic", home=str(tmp_path))
    ref = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"]["content"]
    seen, last = [], None
    with httpx.stream("POST", d.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        sid = r.headers["x-superfluid-session"]
        for eid, data in iter_sse(r.iter_lines()):
            if isinstance(data, dict) and data["choices"] and data["choices"][0]["delta"].get("content"):
                seen.append(data["choices"][0]["delta"]["content"])
                last = eid
                if len(seen) == 10:
                    os.kill(d.proc.pid, signal.SIGKILL)
                    break
    d.proc.wait(10)
    d = Daemon("--deterministic", home=str(tmp_path))
    try:
        rest, finish = [], None
        with httpx.stream("GET", f"{d.url}/v1/sessions/{sid}/resume", headers={"Last-Event-ID": last},
                          timeout=60) as r:
            for _, data in iter_sse(r.iter_lines()):
                if data == "[DONE]":
                    break
                assert "error" not in data, data
                ch = data["choices"][0]
                rest.append(ch["delta"].get("content", ""))
                finish = ch["finish_reason"] or finish
        assert "".join(seen + rest) == ref
        assert finish == "length"
    finally:
        d.stop()


def test_a_cut_constrained_generation_continues_under_its_grammar(tmp_path):
    """The continuation's sampler gets the turn's tokens as history: the grammar picks up
    mid-JSON instead of starting over, so the whole output still matches the schema."""
    import json

    import httpx
    import jsonschema

    from superfluid.client import iter_sse
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                               "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                        "maxItems": 4}},
              "required": ["name", "tags"], "additionalProperties": False}
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 120, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Describe a cat as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}}
    d = Daemon(home=str(tmp_path))
    seen, last = [], None
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=60) as r:
        sid = r.headers["x-superfluid-session"]
        for eid, data in iter_sse(r.iter_lines()):
            if isinstance(data, dict) and data["choices"] and data["choices"][0]["delta"].get("content"):
                seen.append(data["choices"][0]["delta"]["content"])
                last = eid
                if len(seen) == 6:
                    os.kill(d.proc.pid, signal.SIGKILL)
                    break
    d.proc.wait(10)
    d = Daemon(home=str(tmp_path))
    try:
        rest = []
        with httpx.stream("GET", f"{d.url}/v1/sessions/{sid}/resume", headers={"Last-Event-ID": last},
                          timeout=60) as r:
            for _, data in iter_sse(r.iter_lines()):
                if data == "[DONE]":
                    break
                rest.append(data["choices"][0]["delta"].get("content", ""))
        jsonschema.validate(json.loads("".join(seen + rest)), schema)
    finally:
        d.stop()
