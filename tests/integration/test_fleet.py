"""A head and two node processes on loopback, driven through the head's HTTP API with the
official openai client: the same tokens as one machine, placement spread, cancel through
the fleet, a cut link (through a TCP proxy) and a killed node, each stream complete with
every token once; garbage and floods on a node's port. Joining (tokens, plaintext, dialing a
listening head) is test_fleet_join.py."""

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from superfluid.client import Client, iter_sse

from .conftest import MODEL
from ..scratch import scratch
from .daemon import Daemon
from .fleet import Node, together
from .proxy import Proxy

STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


@pytest.fixture(scope="module")
def fleet():
    a, b = together(lambda: Node("--lease", "3"), lambda: Node("--lease", "3"))
    proxy = Proxy(a.port)  # the head reaches node A through a proxy that can cut the link
    head = Daemon("--fleet", f"127.0.0.1:{proxy.port},127.0.0.1:{b.port}", "--resume-grace", "0",
                  "--fleet-timeout", "2")
    yield head, a, b, proxy
    head.stop()
    proxy.close()
    a.stop()
    b.stop()


def oc(d):
    return openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=120)


def nodes(head) -> list[dict]:
    return next(iter(head.health()["models"].values()))["nodes"]


def test_the_fleet_gives_the_tokens_one_machine_gives(fleet, client):
    head = fleet[0]
    kw = dict(model=MODEL, messages=STORY, max_tokens=40, temperature=0)
    assert oc(head).chat.completions.create(**kw).choices[0].message.content == \
        client.chat.completions.create(**kw).choices[0].message.content
    assert all(n["up"] for n in nodes(head))


def test_forced_tool_calls_and_grammars_work_through_the_fleet(fleet):
    import json
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    r = oc(fleet[0]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], temperature=0, max_tokens=60,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": params}}],
        tool_choice="required")
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}
    assert r.choices[0].finish_reason == "tool_calls"


def test_sessions_spread_over_the_nodes(fleet):
    head = fleet[0]
    seen: set[str] = set()
    stop = threading.Event()

    def one():
        with httpx.stream("POST", head.url + "/v1/chat/completions", timeout=60,
                          json={"model": MODEL, "messages": STORY, "max_tokens": 60, "stream": True}) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(seen) < 2:
        seen |= {n["addr"] for n in nodes(head) if n["placed"] > 0}
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(60)
    assert len(seen) == 2


def node_lanes(head) -> dict[str, float]:
    """The head's /metrics: active lanes per node (its superfluid_node_lanes_active series)."""
    text = httpx.get(head.url + "/metrics", timeout=10).text
    return {s.labels["node"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == "superfluid_node_lanes_active"}


def test_the_heads_metrics_health_and_top_show_the_nodes_lanes_while_they_generate(fleet):
    head, _, b, proxy = fleet
    # the last test's cancelled streams gone from the head's count, so that placement by load
    # puts one of these two on each node (not both on the node it thought idle)
    until(head, lambda rows: all(n["placed"] == 0 for n in rows), 30, "no generation placed")
    stop = threading.Event()

    def one():
        while not stop.is_set():  # a stream that ends early (a node still settling after the last test) goes again
            with httpx.stream("POST", head.url + "/v1/chat/completions", timeout=60,
                              json={"model": MODEL, "messages": STORY, "max_tokens": 400, "ignore_eos": True,
                                    "stream": True}) as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        return
            time.sleep(0.1)

    threads = [threading.Thread(target=one) for _ in range(2)]  # load-aware placement: one on each node
    for t in threads:
        t.start()
    try:
        want = {f"127.0.0.1:{proxy.port}", f"127.0.0.1:{b.port}"}
        deadline, lanes = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            lanes = node_lanes(head)
            if set(lanes) == want and all(v >= 1 for v in lanes.values()):
                break
            time.sleep(0.05)
        assert set(lanes) == want and all(v >= 1 for v in lanes.values()), lanes
        h = next(iter(head.health()["models"].values()))
        assert h["running"] >= 2 and {n["addr"] for n in h["nodes"] if n["lanes"] >= 1} == want
        target = head.url.split("//")[1]

        def top() -> tuple[str, dict[str, list[str]]]:
            r = subprocess.run([sys.executable, "-m", "superfluid.cli", "top", "--once", "--interval", "0.2", target],
                               capture_output=True, text=True, timeout=60, env={"COLUMNS": "160", "PATH": ""})
            assert r.returncode == 0, r.stderr
            rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in r.stdout.splitlines() if ln.count("│") > 2]
            return r.stdout, {row[0].lstrip("└ "): row for row in rows}

        def busy(by_server: dict[str, list[str]]) -> bool:  # the head with both lanes, a row per node with its own
            return (by_server[target][1] == "up" and int(by_server[target][2]) >= 2
                    and all(by_server[a][1] == "up" and int(by_server[a][2]) >= 1 for a in want))

        # a stream that has run its 400 tokens starts again, and for that moment its node has no lane:
        # a few snapshots, each of which must show every row, and one of which must show both busy
        for _ in range(5):
            out, by_server = top()
            assert {target} | want <= set(by_server), out
            if busy(by_server):
                break
        assert busy(by_server), out
    finally:
        stop.set()
        for t in threads:
            t.join(60)


def decoded(rows: list[dict]) -> int:
    """Decode steps the nodes ran, as their last status reports say."""
    return sum(int(n["status"].get("counters", {}).get("decode_tokens", 0)) for n in rows)


def until(head, ok, timeout: float, what: str) -> list[dict]:
    """The head's node rows once ok(rows) holds; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        rows = nodes(head)
        if ok(rows):
            return rows
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:.0f} s for {what}: {rows}")
        time.sleep(0.1)


def test_cancel_reaches_the_node(fleet):
    """A client that hangs up stops the generation on the node, not only at the head. A node
    reports within 0.25 s of a change, so each step waits for a report sent after the one
    before it: the node running the lane (after placement), then running none (after the
    hang-up), with fewer decode steps than the whole generation (so it did not just end)."""
    head = fleet[0]
    max_tokens = 900

    def idle(rows):
        return all(n["placed"] == 0 and n["status"].get("running", 0) == 0 for n in rows)

    rows = until(head, idle, 60, "an earlier test's generations to end")
    base = decoded(rows)
    with httpx.stream("POST", head.url + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": STORY, "max_tokens": max_tokens, "ignore_eos": True,
                            "stream": True}) as r:
        lines, deadline = r.iter_lines(), time.monotonic() + 30
        while True:  # read on (the stream stays live) until the node it was placed on reports its lane
            for _ in range(6):
                next(lines)
            if any(n["placed"] >= 1 and n["status"].get("running", 0) >= 1 for n in nodes(head)):
                break
            assert time.monotonic() < deadline, f"no node reported the generation: {nodes(head)}"
    # the stream is closed: the head cancels, and the node that ran it must report no lane
    rows = until(head, idle, 15, "the node to stop generating")
    assert 0 < decoded(rows) - base < max_tokens - 1, (base, rows)  # cut short, not run to its end


def stream_text(head, after_first=None, body_extra=None):
    text, finish = "", None
    stream = oc(head).chat.completions.create(model=MODEL, messages=STORY, max_tokens=80, temperature=0,
                                              stream=True, **(body_extra or {}))
    for i, ch in enumerate(stream):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
        if i == 8 and after_first is not None:
            after_first()
    return text, finish


def test_a_cut_link_loses_and_repeats_nothing(fleet, client):
    head, a, b, proxy = fleet
    ref = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=80, temperature=0)
    b.proc.send_signal(subprocess.signal.SIGSTOP)  # everything goes to A (behind the proxy) meanwhile
    try:
        text, finish = stream_text(head, after_first=proxy.cut)
    finally:
        b.proc.send_signal(subprocess.signal.SIGCONT)
    assert proxy.cuts == 1
    assert text == ref.choices[0].message.content
    assert finish == ref.choices[0].finish_reason


def test_a_killed_head_restarts_resumes_from_its_log_and_the_node_fences_the_old_work(fleet, client):
    _, _, b, _ = fleet
    home = scratch("superfluid-head-")
    h = Daemon("--fleet", f"127.0.0.1:{b.port}", home=home)
    body = {"model": MODEL, "messages": STORY, "max_tokens": 900, "temperature": 0, "stream": True,
            "ignore_eos": True}  # 15 s of work: only the lease (3 s here) can end it early
    seen, last = [], None
    with httpx.stream("POST", h.url + "/v1/chat/completions", json=body, timeout=60) as r:
        sid = r.headers["x-superfluid-session"]
        for eid, data in iter_sse(r.iter_lines()):
            if isinstance(data, dict) and data["choices"] and data["choices"][0]["delta"].get("content"):
                seen.append(data["choices"][0]["delta"]["content"])
                last = eid
                if len(seen) == 8:
                    os.kill(h.proc.pid, signal.SIGKILL)
                    break
    h.proc.wait(10)
    h2 = Daemon("--fleet", f"127.0.0.1:{b.port}", home=home)
    try:
        with Client(h2.url) as c:
            committed = "".join(e["text"] for e in c.events(sid) if e["type"] == "generated")
            rest = "".join(e["choices"][0]["delta"].get("content", "") for _, e in c.resume(
                sid, after=int(last.rsplit(":", 1)[1]), continue_cut=False) if e.get("choices"))
            assert "".join(seen) + rest == committed  # what was committed is all there, once
            assert c.get(sid)["epoch"] >= 2
        deadline = time.monotonic() + 20  # the old head's generation: fenced when its lease runs out
        while time.monotonic() < deadline and nodes(h2)[0]["status"].get("running", 1) != 0:
            time.sleep(0.5)
        assert nodes(h2)[0]["status"]["running"] == 0
        assert oc(h2).chat.completions.create(model=MODEL, messages=STORY, max_tokens=4).choices[0].message.content
    finally:
        h2.stop()


def test_a_node_that_comes_back_after_being_replaced_delivers_nothing_stale(fleet, client):
    head, a, b, proxy = fleet
    ref = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=80, temperature=0)
    deadline = time.monotonic() + 20
    while not all(n["up"] for n in nodes(head)) and time.monotonic() < deadline:
        time.sleep(0.1)
    b.proc.send_signal(signal.SIGSTOP)  # the stream lands on A ...

    def freeze_a():  # ... then A freezes (not dead: its port still accepts) and B takes over
        a.proc.send_signal(signal.SIGSTOP)
        b.proc.send_signal(signal.SIGCONT)
    try:
        text, finish = stream_text(head, after_first=freeze_a)
    finally:
        b.proc.send_signal(signal.SIGCONT)
        a.proc.send_signal(signal.SIGCONT)  # A comes back with a stale generation in its buffer
    assert text == ref.choices[0].message.content and finish == ref.choices[0].finish_reason
    deadline = time.monotonic() + 20  # A's old link is gone: its stale generation is fenced by its lease
    while not ("fencing" in a.log() and sum(n["placed"] for n in nodes(head)) == 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "fencing" in a.log()
    assert sum(n["placed"] for n in nodes(head)) == 0


def test_a_killed_node_fails_over_with_one_continuous_stream(fleet, client):
    head, a, b, proxy = fleet
    ref = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=80, temperature=0)
    deadline = time.monotonic() + 20
    while not all(n["up"] for n in nodes(head)) and time.monotonic() < deadline:
        time.sleep(0.1)
    b.proc.send_signal(subprocess.signal.SIGSTOP)  # the stream lands on A; then A dies and B takes over
    try:
        def kill_a():
            a.kill()
            b.proc.send_signal(subprocess.signal.SIGCONT)
        text, finish = stream_text(head, after_first=kill_a)
    finally:
        b.proc.send_signal(subprocess.signal.SIGCONT)
    assert text == ref.choices[0].message.content
    assert finish == ref.choices[0].finish_reason


def test_garbage_and_stalled_handshakes_never_hurt_a_node(fleet):
    import socket
    head, _, b, _ = fleet
    for payload in [b"GET / HTTP/1.1\r\n\r\n", b"SFL1E" + b"\xff" * 300, b"SFL1P" + b"\xff\xff\xff\x7f" + b"x" * 64,
                    b"SFL1X", b"\x00" * 1000]:
        with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
            s.sendall(payload)
            s.settimeout(10)
            try:
                assert s.recv(100) in (b"",)  # dropped, nothing answered
            except (ConnectionResetError, TimeoutError):
                pass
    stalled = [socket.create_connection(("127.0.0.1", b.port)) for _ in range(3)]  # never finish a handshake
    try:
        assert oc(head).chat.completions.create(model=MODEL, messages=STORY, max_tokens=4).choices[0].message.content
        assert "refused a head" in b.log() or "went away" in b.log()
        assert all(n["up"] for n in nodes(head) if n["addr"].endswith(str(b.port)))
    finally:
        for s in stalled:
            s.close()


def test_a_real_head_gets_in_while_idle_sockets_flood_the_node(fleet):
    """A node holds at most 8 connections mid-handshake, each up to 10 s; refusing any more
    would let 8 idle sockets keep a real head out, so a new connection past the limits
    closes the oldest waiting one instead. With 50 idle sockets open a head's handshake (a real
    Link F HELLO, from here) completes, and the head that is connected goes on serving.
    (Node B: an earlier test killed node A.)"""
    import asyncio
    import socket

    from superfluid.link import messages as m
    from superfluid.net.transport import Link
    head, _, b, _ = fleet
    idle = [socket.create_connection(("127.0.0.1", b.port), timeout=5) for _ in range(50)]

    async def hello() -> str:
        link = await Link.dial("127.0.0.1", b.port, m.LINK_F, None)
        try:
            return (await link.greet(m.Hello((m.VERSION,), "a-test-head"), 5.0)).node
        finally:
            link.close()
    try:
        assert asyncio.run(hello())  # the node answered our HELLO, through the flood
        assert oc(head).chat.completions.create(model=MODEL, messages=STORY, max_tokens=2).choices[0].message
    finally:
        for s in idle:
            s.close()


def test_malformed_messages_drop_the_link_not_the_node(fleet):
    import asyncio

    from superfluid.link import messages as msg
    from superfluid.net.transport import Link
    head, _, b, _ = fleet

    async def poke(kind, body):
        link = await Link.dial("127.0.0.1", b.port, msg.LINK_F, None)
        link.send_raw(msg.HELLO, {"versions": [msg.VERSION]})
        assert (await link.recv())[0] == msg.HELLO_ACK
        link.send_raw(kind, body)
        try:
            while True:  # the node drops us (keepalives may come first)
                await asyncio.wait_for(link.recv(), 10)
        except ConnectionError:
            return True
        finally:
            link.close()

    for kind, body in [(msg.GENERATE_REQ, {"cmd": 1}), (msg.GENERATE_REQ, {"cmd": "x", "gen": 3}),
                       (msg.WATERMARK_ACK, {"gen": "g"}), (msg.RECONCILE, {"gens": {"g": "nope"}}),
                       (msg.SESSION_REVOKE, {}), (999, {})]:
        assert asyncio.run(poke(kind, body))
    deadline = time.monotonic() + 10  # the node's log lines are written by a thread: wait for them
    while not ("malformed body" in b.log() and "unknown required message type 999" in b.log()) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "malformed body" in b.log() and "unknown required message type 999" in b.log()
    assert oc(head).chat.completions.create(model=MODEL, messages=STORY, max_tokens=4).choices[0].message.content
