"""mDNS discovery on loopback: `superfluid node join` without an address finds the head of its
own fleet (never another fleet's, advertised alongside), serves it, and when that head goes
away and a new one appears elsewhere, finds the new one."""

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time

import openai

from superfluid.fleet.discovery import Advertiser, discover, fleet_id
from superfluid.link.noise import psk_of

from .conftest import MODEL
from .daemon import Daemon, free_port

STORY = [{"role": "user", "content": "Write a short poem about the sea."}]


def nodes(head) -> list[dict]:
    return next(iter(head.health()["models"].values()))["nodes"]


def wait_up(head, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(n["up"] for n in nodes(head)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no node joined: {nodes(head)}")


def test_fleet_ids_tell_fleets_apart():
    a, b = psk_of("a" * 64), psk_of("b" * 64)
    assert fleet_id(a) == fleet_id(psk_of("a" * 64)) != fleet_id(b)
    assert fleet_id(None) == "open" and "a" * 8 not in fleet_id(a)


class _Decoy:
    """Another fleet's head on mDNS: a listener that counts who connects."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.loop = asyncio.new_event_loop()  # zeroconf answers queries from this loop: keep it running
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        threading.Thread(target=self._accept, daemon=True).start()
        self.advert = self._run(Advertiser.start("127.0.0.1", self.port, psk_of("e" * 64)))
        assert self.advert is not None

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self):
        self._run(self.advert.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.sock.close()


def test_discover_finds_only_heads_of_its_own_fleet():
    decoy = _Decoy()
    try:
        assert asyncio.run(discover(psk_of("f" * 64), interface="127.0.0.1", timeout=2)) == []
        assert asyncio.run(discover(psk_of("e" * 64), interface="127.0.0.1", timeout=5)) == [("127.0.0.1", decoy.port)]
    finally:
        decoy.close()


def test_a_node_finds_its_head_by_mdns_and_follows_it_when_it_moves(tmp_path, client):
    tok = tmp_path / "token"
    tok.write_text("c" * 64)
    decoy = _Decoy()
    env = {**os.environ, "SUPERFLUID_HOME": str(tmp_path / "n"), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "node.log", "w")
    node = subprocess.Popen([sys.executable, "-m", "superfluid.cli", "node", "join", "--auth-file", str(tok),
                             "--mdns-interface", "127.0.0.1", "--name", "finder", "--threads", "1",
                             "--max-context", "1024"], env=env, stdout=log, stderr=subprocess.STDOUT)
    kw = dict(model=MODEL, messages=STORY, max_tokens=24, temperature=0)
    want = client.chat.completions.create(**kw).choices[0].message.content
    heads = []
    try:
        for i in range(2):  # the first head, then a second one on another port (the head moved)
            head = Daemon("--fleet-listen", f"127.0.0.1:{free_port()}", "--fleet-auth", str(tok),
                          home=str(tmp_path / f"h{i}"))
            heads.append(head)
            wait_up(head)
            assert [n["name"] for n in nodes(head)] == ["finder"]
            oc = openai.OpenAI(base_url=head.url + "/v1", api_key="x", max_retries=0, timeout=120)
            assert oc.chat.completions.create(**kw).choices[0].message.content == want
            head.stop()
    finally:
        node.terminate()
        node.wait(20)
        log.close()
        for h in heads:
            h.stop()
        decoy.close()
    text = (tmp_path / "node.log").read_text()
    assert text.count("found a head at 127.0.0.1") >= 2, text
    assert decoy.connections == 0  # another fleet's head is never dialed
