"""`superfluid top`: one frame over a live server, a dead address and a keyed server."""

import subprocess
import sys

from .daemon import free_port


def top(*args, home: str = ""):
    env = {"COLUMNS": "160", "PATH": ""} | ({"SUPERFLUID_HOME": home} if home else {})
    return subprocess.run([sys.executable, "-m", "superfluid.cli", "top", "--once", "--interval", "0.2", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_top_shows_up_and_down(daemon):
    target = daemon.url.split("//")[1]
    dead = f"127.0.0.1:{free_port()}"
    r = top(target, dead)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    up = next(ln for ln in lines if target in ln)
    down = next(ln for ln in lines if dead in ln)
    assert " up " in up and "%" in up
    assert " down " in down


def test_top_reports_401_without_the_key():
    from .daemon import Daemon
    d = Daemon("--api-key", "sk-top-secret", max_batch=1, max_context=256)
    try:
        target = d.url.split("//")[1]
        assert " 401 " in top(target).stdout
        # the key goes to a loopback server only once it proves it is this user's (api/listener.py)
        assert " up " in top(target, "--api-key", "sk-top-secret", home=d.home).stdout
        assert " not yours " in top(target, "--api-key", "sk-top-secret").stdout  # another home: not proven
    finally:
        d.stop()
