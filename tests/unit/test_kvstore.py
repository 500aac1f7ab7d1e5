"""The disk tier's files (runtime/kvstore.py): round trip, a restart's index, and every bad
file (corrupt, truncated, another model's, misnamed) ignored and deleted; the cap and LRU."""

import os
import struct
import time

import pytest

from superfluid.plan import kv_key
from superfluid.runtime.kvstore import MAGIC, KvStore, file_fingerprint


def entry(seed: int, n: int = 100, size: int = 4096) -> tuple[int, tuple[int, ...], bytes]:
    tokens = tuple(10 + (seed * 31 + i) % 900 for i in range(n))
    return kv_key(tokens), tokens, bytes((seed + i) % 251 for i in range(size))


@pytest.fixture
def store(tmp_path):
    s = KvStore(tmp_path, "fp-a", 1 << 20)
    yield s
    s.close()


def test_a_namespaced_entry_keeps_its_namespace_across_a_restart(tmp_path, store):
    tokens = tuple(range(10, 110))
    key = kv_key(tokens, "0123abcd")
    assert store.put(key, tokens, b"kv" * 100, ns="0123abcd")
    store.flush()
    again = KvStore(tmp_path, "fp-a", 1 << 20)
    try:
        assert again.scan() == [(key, tokens, "0123abcd", ())]
    finally:
        again.close()
    os.rename(tmp_path / "fp-a" / f"{key:016x}.kv", tmp_path / "fp-a" / f"{kv_key(tokens):016x}.kv")
    moved = KvStore(tmp_path, "fp-a", 1 << 20)  # renamed into the shared namespace: not loaded
    try:
        assert moved.scan() == []
    finally:
        moved.close()


def test_put_get_and_a_restart_finds_the_entries(tmp_path, store):
    key, tokens, data = entry(1)
    assert store.put(key, tokens, data)
    assert store.get(key) == data  # served from memory while the writer works, or from disk
    store.flush()
    assert store.get(key) == data
    again = KvStore(tmp_path, "fp-a", 1 << 20)
    try:
        assert again.scan() == [(key, tokens, "", ())]
        assert again.get(key) == data
    finally:
        again.close()


def test_a_corrupt_entry_is_not_loaded_and_is_deleted(tmp_path, store):
    key, tokens, data = entry(2)
    store.put(key, tokens, data)
    store.flush()
    path = store.dir / f"{key:016x}.kv"
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF  # one flipped byte in the state
    path.write_bytes(bytes(raw))
    assert store.get(key) is None
    assert not path.exists()
    assert store.take_dropped()[0] == [key]


@pytest.mark.parametrize("damage", ["truncated", "foreign", "misnamed", "garbage", "tokens"])
def test_bad_files_are_ignored_and_removed_at_scan(tmp_path, damage):
    a = KvStore(tmp_path, "fp-a", 1 << 20)
    key, tokens, data = entry(3)
    a.put(key, tokens, data)
    a.close()
    path = a.dir / f"{key:016x}.kv"
    target = path
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-10])
    elif damage == "foreign":  # another model's (or KV format's) entry copied into this folder
        other = KvStore(tmp_path, "fp-b", 1 << 20)
        other.close()
        target = other.dir / path.name
        os.replace(path, target)
        a = other
    elif damage == "misnamed":
        target = path.with_name(f"{key + 1:016x}.kv")
        os.replace(path, target)
    elif damage == "garbage":
        path.write_bytes(b"not a kv entry at all")
    elif damage == "tokens":  # the header's tokens changed: its checksum no longer matches
        raw = path.read_bytes()
        i = raw.index(bytes([tokens[5], 0, 0, 0]))
        path.write_bytes(raw[:i] + bytes([tokens[5] + 1]) + raw[i + 1:])
    b = KvStore(tmp_path, "fp-b" if damage == "foreign" else "fp-a", 1 << 20)
    try:
        assert b.scan() == []
        assert not target.exists()
    finally:
        b.close()


def test_the_cap_evicts_least_recently_used_and_pinned_last(tmp_path):
    size = 4096
    s = KvStore(tmp_path, "fp", 3 * size + 3 * 600)  # room for three entries and their headers (~470 B)
    try:
        e = [entry(i, size=size) for i in range(5)]
        s.put(*e[0], pinned=True)
        s.flush()
        for x in e[1:3]:
            s.put(*x)
            s.flush()
            time.sleep(0.01)
        assert s.get(e[1][0]) is not None  # touched: e[2] is now the least recently used
        time.sleep(0.01)
        s.put(*e[3])
        s.flush()
        dropped, evicted = s.take_dropped()
        assert dropped == [e[2][0]] and evicted > size
        s.put(*e[4])
        s.flush()
        assert s.take_dropped()[0] == [e[1][0]]  # the pinned entry outlives older unpinned ones
        assert s.get(e[0][0]) is not None and s.total_bytes <= s.cap
    finally:
        s.close()


def test_an_entry_larger_than_the_cap_is_refused(tmp_path):
    s = KvStore(tmp_path, "fp", 1000)
    try:
        key, tokens, data = entry(7, size=5000)
        assert not s.put(key, tokens, data)
        assert s.take_dropped()[0] == [key]
    finally:
        s.close()


def test_fingerprint_changes_with_content_and_format(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"a" * 5_000_000)
    f1 = file_fingerprint(str(p), "llamacpp-1")
    assert f1 == file_fingerprint(str(p), "llamacpp-1")
    assert f1 != file_fingerprint(str(p), "llamacpp-2")
    raw = bytearray(p.read_bytes())
    raw[2_500_000 // 17 * 8] ^= 1  # a byte inside one of the sampled pieces
    p.write_bytes(bytes(raw))
    assert f1 != file_fingerprint(str(p), "llamacpp-1")


@pytest.mark.parametrize("body", [
    b"",  # empty
    MAGIC,  # the magic, then nothing: no header length
    MAGIC + b"\x02\x00",  # a header length cut short
    MAGIC + struct.pack("<I", 3) + b"\xc1\xc1\xc1",  # not msgpack
    MAGIC + struct.pack("<I", 1) + b"\x05",  # msgpack, not a map
], ids=["empty", "magic-only", "short-length", "not-msgpack", "not-a-map"])
def test_a_malformed_entry_is_deleted_at_start_and_the_rest_load(tmp_path, body):
    good = KvStore(tmp_path, "fp-a", 1 << 20)
    key, tokens, data = entry(1)
    assert good.put(key, tokens, data)
    good.flush()
    good.close()
    bad = tmp_path / "fp-a" / f"{key + 1:016x}.kv"
    bad.write_bytes(body)
    s = KvStore(tmp_path, "fp-a", 1 << 20)
    try:
        assert [k for k, *_ in s.scan()] == [key]
        assert not bad.exists()
    finally:
        s.close()
