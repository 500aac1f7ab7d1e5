"""A GGUF split by layers over the head's CPU and two llama.cpp RPC nodes (`node serve --rpc`,
`serve --rpc-nodes`), with the fleet token, on loopback, driven with the openai client:
the split serves the greedy text of one machine; each node holds a share of the quantized
weights; the bytes between head and node are Noise ciphertext; the nodes' RPC servers
listen in network namespaces of their own, on no port of the host; a wrong token gets
nothing; a node killed mid-stream is a typed error and the model comes back on the devices
that remain; a restarted node takes the tensors it cached instead of receiving them again;
nodes that join (`node join --rpc`) are taken in by name or `auto`, and one that joins late
by a reload."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time

import httpx
import openai
import psutil
import pytest

from superfluid.link import messages as m
from superfluid.link.noise import AuthFailed
from superfluid.runtime import rpc

from .daemon import Daemon, free_port
from .fleet import Node
from .proxy import Proxy

try:
    rpc.library()
except rpc.RpcUnavailable as e:  # the install step (.ci/run) builds it; a plain pip install may not have
    pytest.fail(str(e), pytrace=False)

MODEL = "SmolLM2-135M-Instruct"
STORY = [{"role": "user", "content": "Tell me a short story about a robot who learns to paint."}]
N = 24
FIRST: dict[str, int] = {}  # bytes each node was sent for the first load


@pytest.fixture(scope="module")
def token(tmp_path_factory):
    path = tmp_path_factory.mktemp("fleet") / "token"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def split(token):
    """Two RPC nodes (the second listening on every interface: its RPC port must not) and
    a head split over its CPU and both, its link to the second node through a recorder. The
    output layer goes to the last node (`--rpc-output last`), so b holds the one tensor over
    ggml's 10 MiB cache threshold; the join test below runs the default (on the head)."""
    a = Node("--rpc", auth_file=token)
    b_port = free_port()
    b = Node("--rpc", "--listen", f"0.0.0.0:{b_port}", auth_file=token, port=b_port)
    rec = Proxy(b.port, keep=64 << 20)  # keeps what passed, to look into
    head = Daemon("--rpc-nodes", f"127.0.0.1:{a.port},127.0.0.1:{rec.port}", "--fleet-auth", token,
                  "--rpc-output", "last", "--sessions-cache", max_batch=2)
    yield head, a, b, rec
    head.stop()
    rec.close()
    for n in (a, b):
        n.stop()


@pytest.fixture(scope="module")
def alone():
    """The same model on one machine, for the text to compare with."""
    d = Daemon("--sessions-cache", max_batch=2)
    yield d
    d.stop()


def oc(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=180)


def greedy(d: Daemon, messages=STORY, n: int = N) -> str:
    r = oc(d).chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0)
    return r.choices[0].message.content


def status(node: Node, psk: bytes | None) -> dict:
    async def hello() -> dict:
        from superfluid.net.transport import Link
        link = await Link.dial("127.0.0.1", node.port, m.LINK_F, psk)
        ack = await link.greet(m.Hello((m.VERSION,), "test"))
        link.close()
        return {**ack.status.report(), "offer": ack.rpc}
    return asyncio.run(hello())


def rss(node: Node) -> int:
    """The node's resident memory, its jailed RPC server's included (runtime/rpc_jail.py)."""
    p = psutil.Process(node.proc.pid)
    return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])


def psk_of(token: str) -> bytes:
    from superfluid.cli.fleet import read_token
    return read_token(token)


def test_a_three_way_split_serves_the_greedy_text_of_one_machine(split, alone, token):
    head, a, b, _ = split
    assert greedy(head) == greedy(alone)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    assert greedy(head, question, 12) == greedy(alone, question, 12)
    model_bytes = os.path.getsize(rpc_model_path())
    for name, node in (("a", a), ("b", b)):
        st = status(node, psk_of(token))
        FIRST[name] = st["rpc"]["bytes_in"]
        assert st["offer"]["total"] > 0 and st["offer"]["threads"] == 1
        # each node was sent about its third of the quantized weights, not a float32 copy
        assert 0.15 * model_bytes < st["rpc"]["bytes_in"] < 0.8 * model_bytes, (st, model_bytes)


def rpc_model_path() -> str:
    from superfluid.runtime.registry import embedded_model
    return embedded_model().path


def test_the_bytes_between_head_and_node_are_ciphertext(split):
    _, _, _, rec = split
    seen = bytes(rec.seen)
    assert len(seen) > 4 << 20  # the node's share of the weights went through
    with open(rpc_model_path(), "rb") as f:
        f.seek(os.path.getsize(rpc_model_path()) - (8 << 20))  # tensor data of the last layers
        tail = f.read(8 << 20)
    probes = [tail[i:i + 32] for i in range(0, len(tail), 1 << 20)]
    assert all(p not in seen for p in probes)
    # no tensor names either; 4-byte strings such as b"GGUF" turn up in ~100 MB of random bytes by chance
    assert b".weight" not in seen and b"attn_norm" not in seen


def test_no_rpc_port_is_open_on_the_host(split):
    """ggml's RPC protocol has no authentication: its server listens only inside a network
    namespace of its own (runtime/rpc_jail.py), so a node's one port on the host is Link F's."""
    _, a, b, _ = split
    host_ns = os.readlink("/proc/self/ns/net")
    for node, link_f in ((a, "127.0.0.1"), (b, "0.0.0.0")):
        proc = psutil.Process(node.proc.pid)
        listening = {(c.laddr.ip, c.laddr.port) for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert listening == {(link_f, node.port)}
        (jail,) = [c for c in proc.children() if "superfluid.runtime.rpc_jail" in c.cmdline()]
        assert os.readlink(f"/proc/{jail.pid}/ns/net") != host_ns
        assert not [c for c in jail.net_connections("tcp") if c.status == psutil.CONN_LISTEN]


def test_a_wrong_token_gets_nothing(split, token, tmp_path):
    _, a, _, _ = split
    before = status(a, psk_of(token))["rpc"]["bytes_in"]

    async def dial(psk: bytes) -> None:
        from superfluid.net.transport import Link
        link = await Link.dial("127.0.0.1", a.port, m.LINK_F, psk)
        try:
            await link.greet(m.Hello((m.VERSION,), "intruder"), 5)
            link.send(m.RpcOpen(1))
            await asyncio.wait_for(link.recv(), 5)
        finally:
            link.close()
    with pytest.raises((AuthFailed, ConnectionError, TimeoutError)):
        asyncio.run(dial(b"\x01" * 32))
    bad = tmp_path / "bad"
    bad.write_text(secrets.token_hex(32))
    d = None
    with pytest.raises(RuntimeError) as e:
        d = Daemon("--rpc-nodes", f"127.0.0.1:{a.port}", "--fleet-auth", str(bad), "--sessions-cache")
    if d is not None:
        d.stop()
    assert "no RPC node answered" in str(e.value)
    assert status(a, psk_of(token))["rpc"]["bytes_in"] == before


def test_a_node_killed_mid_stream_is_a_typed_error_then_the_model_serves_on_what_remains(split, alone, token):
    head, a, b, rec = split
    body = {"model": MODEL, "messages": STORY, "max_tokens": 400, "ignore_eos": True, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", head.url + "/v1/chat/completions", json=body, timeout=180) as r:
        lines = r.iter_lines()
        got = 0
        while got < 3:
            got += next(lines).startswith("data: ")
        b.kill()
        rest = [ln for ln in lines if ln.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    errors = [json.loads(ln[6:]) for ln in rest[:-1] if '"error"' in ln]
    assert errors and errors[0]["error"]["code"] == "stage_unavailable", errors
    # the new worker loads the model on this host and the node that is left
    deadline = time.monotonic() + 120
    while True:
        try:
            assert greedy(head) == greedy(alone)
            break
        except openai.APIStatusError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_a_restarted_node_takes_its_cached_tensors_instead_of_receiving_them(split, token):
    """b was killed above; it comes back on its port with its home (and tensor cache), and a
    reload of the model (admin `/v1/models/load` with `reload`) takes it into the split again."""
    head, a, b, rec = split
    cache = os.path.join(b.home, "rpc-cache")
    assert os.listdir(cache)  # b kept the tensors over 10 MiB it was sent
    back = Node("--rpc", "--listen", f"0.0.0.0:{b.port}", auth_file=token, port=b.port, home=b.home)
    try:
        r = httpx.post(f"{head.url}/v1/models/load", json={"model": MODEL, "reload": True}, timeout=180)
        assert r.status_code == 200, r.text
        greedy(head, n=4)
        got = status(back, psk_of(token))["rpc"]["bytes_in"]
        cached = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache))
        assert cached > 10 << 20 and FIRST["b"] > cached
        # the same share as the first time, less what it had cached
        assert 0 < got < FIRST["b"] - 0.9 * cached, (got, FIRST["b"], cached)
    finally:
        back.stop()


def cached(node: Node) -> int:
    """Bytes of tensors the node keeps in its cache (ggml's server saves those over 10 MiB it
    is sent: here only the 28 MiB output tensor, when the split's last device holds it)."""
    cache = os.path.join(node.home, "rpc-cache")
    return sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache)) if os.path.isdir(cache) else 0


def test_nodes_that_join_are_split_over_by_name_and_auto_and_a_late_one_after_a_reload(token, alone, tmp_path):
    """`serve --rpc-nodes j1,auto --fleet-listen`: j1 joins before the head starts and is
    waited for by name; j2 joins once the model is loaded, is held out of the split, and a
    reload takes it in as the last device (its name sorts after j1's). Another model the
    head serves (--model-dir) runs on the head alone: the split is the default model's. The
    output layer stays on the head (the default --rpc-output): no node is sent it."""
    port = free_port()
    (tmp_path / "other.gguf").symlink_to(rpc_model_path())
    j1 = Node("--rpc", "--name", "j1", auth_file=token, join=f"127.0.0.1:{port}")
    head = j2 = None
    try:
        head = Daemon("--rpc-nodes", "j1,auto", "--fleet-listen", f"127.0.0.1:{port}", "--fleet-auth", token,
                      "--no-mdns", "--sessions-cache", "--model-dir", str(tmp_path), max_batch=2)
        assert greedy(head) == greedy(alone)
        assert cached(j1) == 0  # j1 is the last device, but the output tensor stayed on the head
        r = oc(head).chat.completions.create(model="other", messages=STORY, max_tokens=4, temperature=0)
        assert r.choices[0].message.content == greedy(alone, n=4)
        j2 = Node("--rpc", "--name", "j2", auth_file=token, join=f"127.0.0.1:{port}")
        time.sleep(1.5)  # it joins at once; the loaded split goes on without it
        assert greedy(head, n=4)
        idle = rss(j2)
        r = httpx.post(f"{head.url}/v1/models/load", json={"model": MODEL, "reload": True}, timeout=180)
        assert r.status_code == 200, r.text
        assert greedy(head) == greedy(alone)
        # now a device of the split: it holds its share of the layers (about 20 MiB)
        assert rss(j2) - idle > 12 << 20
        assert cached(j2) == 0
    finally:
        for p in (head, j2, j1):
            if p is not None:
                p.stop()
