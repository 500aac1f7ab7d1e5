"""Joining a fleet, as processes on loopback: a wrong token refused on both sides, plaintext
only on loopback, nodes that dial a listening head (and dial again after it restarts), and
`superfluid fleet token`. The running fleet itself is test_fleet.py."""

import os
import subprocess
import sys
import time

from .conftest import MODEL
from .daemon import Daemon, free_port
from .fleet import Node
from .test_fleet import STORY, nodes, oc


def test_a_wrong_token_is_refused_on_both_sides(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("a" * 64)
    bad.write_text("b" * 64)
    node = Node(auth_file=str(good))
    try:
        r = subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", "--port", str(free_port()),
                            "--fleet", f"127.0.0.1:{node.port}", "--fleet-auth", str(bad), "--no-tui"],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "SUPERFLUID_HOME": str(tmp_path / "home")})
        assert r.returncode == 1
        assert f"node 127.0.0.1:{node.port} refused the fleet token" in r.stderr
        assert "--fleet-auth and the node's --auth-file differ" in r.stderr
        deadline = time.monotonic() + 10
        while "fleet token differs" not in node.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "refused a head" in node.log() and "fleet token differs" in node.log()
    finally:
        node.stop()


def test_plaintext_is_for_loopback_only(tmp_path):
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "node", "serve", "--listen", "0.0.0.0:0"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "SUPERFLUID_HOME": str(tmp_path)})
    assert r.returncode == 2 and "--auth-file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", "--fleet", "10.1.2.3:8454"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "SUPERFLUID_HOME": str(tmp_path)})
    assert r.returncode == 2 and "--fleet-auth" in r.stderr


def test_nodes_can_join_a_listening_head_and_join_again(tmp_path, client):
    tok = tmp_path / "token"
    tok.write_text("c" * 64)
    port = free_port()
    env = {**os.environ, "SUPERFLUID_HOME": str(tmp_path / "n"), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "superfluid.cli", "node", "join", f"127.0.0.1:{port}", "--threads", "1",
           "--max-context", "1024"]
    bad = subprocess.Popen(cmd + ["--token", "d" * 64], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    node = subprocess.Popen(cmd + ["--auth-file", str(tok)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    # the nodes dial until the head listens; the head is healthy once one has joined
    head = Daemon("--fleet-listen", f"127.0.0.1:{port}", "--fleet-auth", str(tok), home=str(tmp_path / "h"))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(n["up"] for n in nodes(head)):
            time.sleep(0.2)
        assert [n["up"] for n in nodes(head)] == [True]  # the node with the wrong token never got in
        kw = dict(model=MODEL, messages=STORY, max_tokens=30, temperature=0)
        assert oc(head).chat.completions.create(**kw).choices[0].message.content == \
            client.chat.completions.create(**kw).choices[0].message.content
        node.terminate()
        node.wait(20)
        node = subprocess.Popen(cmd + ["--auth-file", str(tok)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # the same node (by name) joins again
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(n["up"] for n in nodes(head)):
            time.sleep(0.2)
        assert [n["up"] for n in nodes(head)] == [True]
        assert oc(head).chat.completions.create(**kw).choices[0].message.content
    finally:
        for p in (bad, node):
            p.terminate()
            p.wait(20)
        head.stop()
    assert "refused a head" in bad.stdout.read()


def test_fleet_token_is_created_once_private_and_printed(tmp_path):
    env = {**os.environ, "SUPERFLUID_HOME": str(tmp_path)}
    run = [sys.executable, "-m", "superfluid.cli", "fleet", "token"]
    first = subprocess.run(run, capture_output=True, text=True, env=env, timeout=60)
    again = subprocess.run(run, capture_output=True, text=True, env=env, timeout=60)
    path = tmp_path / "fleet" / "token"
    assert first.returncode == 0 and len(first.stdout.strip()) == 64 and int(first.stdout.strip(), 16) >= 0
    assert again.stdout == first.stdout == path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
