"""A pull the daemon runs is bounded (issue 54; runtime/pull_bounds.py), against a loopback
mirror of the hub (HF_ENDPOINT) serving real files: a name whose files are over the size cap,
or that would leave the cache's disk under its free room, is refused before a byte is
fetched; a disk that fills during the download stops it and its partial file goes. Before,
a client's pull ran to whatever size the repo had, and to a full disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..scratch import scratch
from .hub_mirror import Mirror

REPO = "test/Bounded-GGUF"
FILE = "bounded-Q4_K_M.gguf"
SIZE = 3 << 20

PULL = """
import json, sys
from huggingface_hub import constants
from superfluid.runtime import hub, pull_bounds
constants.DOWNLOAD_CHUNK_SIZE = 64 << 10  # the file arrives in many pieces, as a big one does
free = iter(json.loads(sys.argv[1]))  # the disk's free bytes, look after look
pull_bounds.free_bytes = lambda where: next(free)
try:
    hub.pull(hub.parse(sys.argv[2]), bounds=pull_bounds.Bounds(int(sys.argv[3]), 1 << 20, every=256 << 10))
    print(json.dumps({"ok": True}))
except hub.ModelLoadError as e:
    print(json.dumps({"status": e.status, "code": e.code, "message": e.message}))
"""


@pytest.fixture(scope="module")
def mirror():
    d = Path(scratch("sf-bounds-"))
    (d / FILE).write_bytes(os.urandom(SIZE))
    m = Mirror()
    m.add(REPO, {FILE: d / FILE})
    m.url = m.start()
    yield m
    m.stop()


def pull(mirror, hf_home: str, free: list[int], max_bytes: int = 1 << 40) -> dict:
    env = {**os.environ, "HF_ENDPOINT": mirror.url, "HF_HOME": hf_home, "HF_HUB_DISABLE_TELEMETRY": "1"}
    r = subprocess.run([sys.executable, "-c", PULL, json.dumps(free), REPO, str(max_bytes)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def fetched(mirror) -> int:
    return sum(1 for m, p, _ in mirror.requests if m == "GET" and p.endswith(FILE))


def leftovers(hf_home: str) -> list[str]:
    return [p.name for p in Path(hf_home).rglob("*") if p.is_file() and p.stat().st_size > 1 << 16]


def test_over_the_size_cap_or_the_disks_room_is_refused_before_a_byte(mirror):
    home = scratch("sf-bounds-home-")
    r = pull(mirror, home, [1 << 40] * 100, max_bytes=SIZE - 1)
    assert r["status"] == 413 and r["code"] == "pull_too_large", r
    r = pull(mirror, home, [SIZE + (1 << 20) - 1] * 100)  # the file would leave under 1 MB free
    assert r["status"] == 507 and r["code"] == "insufficient_storage", r
    assert fetched(mirror) == 0 and leftovers(home) == []
    assert pull(mirror, home, [1 << 40] * 100) == {"ok": True}  # within both: pulled


def test_a_disk_that_fills_during_the_download_stops_it_and_its_partial_file_goes(mirror):
    home = scratch("sf-bounds-home-")
    before = fetched(mirror)
    r = pull(mirror, home, [1 << 40] * 4 + [1 << 19] * 100)  # room at first, then under 1 MB
    assert r["status"] == 507 and "the download was stopped" in r["message"], r
    assert fetched(mirror) == before + 1
    assert leftovers(home) == []  # the partial file is gone (and nothing was served)
