"""What the daemon keeps is its owner's alone, whatever the umask: the session store's
directory 0700 and its database, WAL and shared-memory files 0600; the KV disk tier's
directories 0700 and entries 0600 (issue 33: prompts and their KV were world-readable)."""

import asyncio
import os
import stat

import pytest

from superfluid.runtime.kvstore import KvStore
from superfluid.session.store import Store


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0o022)  # the usual default: files 0644, directories 0755
    yield
    os.umask(old)


def test_the_session_store_is_private(tmp_path, open_umask):
    d = tmp_path / "sessions"
    d.mkdir(mode=0o755)  # a directory made earlier, world-readable
    s = Store(d).open()
    try:
        async def write():
            await s.put_response("resp_1", None, b"{}")  # a write: the WAL exists
        asyncio.run(write())
        assert (d / "sessions.db-wal").exists()
        for p in d.iterdir():
            if p.name.startswith("sessions.db"):
                assert mode(p) == 0o600, p  # while open, the WAL and shared memory too
    finally:
        s.close()
    assert mode(d) == 0o700
    files = [p for p in d.iterdir() if p.name.startswith("sessions.db")]
    assert any(p.name == "sessions.db" for p in files)
    for p in files:
        assert mode(p) == 0o600, p


def test_the_kv_disk_tier_is_private(tmp_path, open_umask):
    kv = KvStore(tmp_path / "kv", "fp-a", 1 << 20)
    try:
        assert kv.put(7, [1, 2, 3], b"x" * 100)
        kv.flush()
    finally:
        kv.close()
    assert mode(tmp_path / "kv") == 0o700 and mode(tmp_path / "kv" / "fp-a") == 0o700
    entries = list((tmp_path / "kv" / "fp-a").iterdir())
    assert entries and all(mode(p) == 0o600 for p in entries)
