"""The disk tier of the KV cache: a lane's KV state saved as one file per entry, so a prefix
computed once is restored, not prefilled again, after an eviction, a respawn or a restart.

Files live in `<home>/kv/<fingerprint>/<key>.kv`; the fingerprint ties them to the model file
and the runtime's KV format. A file is MAGIC, a u32 header length, a msgpack header
{fp, tokens (int32 LE), size, crc, hcrc, ns: the prefix-cache namespace, when not the
shared one, and marks: where a checkpointed state can be cut (runtime/checkpoints.py), when
any} and the runtime's state bytes. The key is plan.kv_key(tokens, ns). A file whose header,
key, fingerprint, size or checksum does not match is deleted, never loaded.

Writes go through one writer thread (never the decode path): `put` queues the bytes (a load
of a queued entry is served from memory meanwhile) and returns. The writer keeps the total
under `cap` bytes, evicting least recently used entries, pinned ones last. Entries that go
(evicted, unwritable, corrupt) are reported by `take_dropped` for the scheduler's index."""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import struct
import threading
import time
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

import msgpack

from ..config import private_dir
from ..plan import kv_key

log = logging.getLogger("superfluid.kvstore")

MAGIC = b"SFKV\x01"
MAX_PENDING = 1 << 30  # bytes queued for the writer; a save beyond it is dropped, not waited for
MAX_HEADER = 64 << 20
MAX_INDEX_TOKENS = 2_000_000  # tokens of all entries the index holds (8 MB of HELLO_ACK)


def file_fingerprint(path: str, extra: str) -> str:
    """A cheap identity of a model file (its size and sampled content: hashing 40 GB at every
    start would take minutes) plus `extra` (the runtime and its KV format)."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    h.update(struct.pack("<Q", size) + extra.encode())
    with open(path, "rb") as f:
        for i in range(18):  # the head (metadata), the tail and 16 evenly spaced pieces
            f.seek(0 if i == 0 else max(0, size - (1 << 20)) if i == 17 else size * i // 17)
            h.update(f.read(1 << 20))
    return h.hexdigest()[:24]


def _tokens_bytes(tokens) -> bytes:
    return array("i", tokens).tobytes()


@dataclass
class _Entry:
    nbytes: int
    used: float
    pinned: bool = False


class KvStore:
    def __init__(self, root: str | Path, fingerprint: str, cap_bytes: int):
        self.dir = private_dir(Path(root))  # the prompts' KV is as private as their text
        self.dir = private_dir(self.dir / fingerprint)
        self.fp = fingerprint
        self.cap = max(0, cap_bytes)
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._pending: dict[int, bytes] = {}  # queued for the writer, served to loads meanwhile
        self._pending_bytes = 0
        self._dropped: list[int] = []
        self._pinned: set[int] = set()  # pinned keys, written or still queued
        self._evicted_bytes = 0
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._writer, name="kv-writer", daemon=True)
        self._thread.start()

    # -- the index at start ----------------------------------------------------------------
    def scan(self) -> list[tuple[int, tuple[int, ...], str, tuple[int, ...]]]:
        """(key, tokens, namespace, marks) of every valid entry, least recently used first; bad
        files go."""
        found: list[tuple[float, int, tuple[int, ...], str, tuple[int, ...]]] = []
        for p in self.dir.glob("*.kv"):
            try:
                with open(p, "rb") as f:
                    head = self._read_header(f, os.fstat(f.fileno()).st_size)
                st = p.stat()
            except (OSError, ValueError, KeyError, TypeError, struct.error, msgpack.UnpackException) as e:
                log.warning("KV entry %s is unusable (%s): deleted", p.name, e)  # as get() treats one
                self._unlink(p)
                continue
            key, tokens, size, ns, marks = head
            if p.name != f"{key:016x}.kv":
                self._unlink(p)
                continue
            self._entries[key] = _Entry(st.st_size, st.st_mtime)
            found.append((st.st_mtime, key, tokens, ns, marks))
        for p in self.dir.glob("*.tmp"):
            try:
                if time.time() - p.stat().st_mtime > 600:
                    self._unlink(p)  # a write cut short by a crash (not another process's, in flight)
            except OSError:
                pass
        found.sort(reverse=True)  # the most recently used first: they fit the index
        kept, total = [], 0
        for _, key, tokens, ns, marks in found:
            total += len(tokens)
            if total > MAX_INDEX_TOKENS:  # the index travels in one Link W frame: the oldest go
                self._forget(key, self._path(key), report=False)
            else:
                kept.append((key, tokens, ns, marks))
        self._evict_over_cap()
        return [e for e in reversed(kept) if e[0] in self._entries]

    def _read_header(self, f, file_size: int) -> tuple[int, tuple[int, ...], int, str, tuple[int, ...]]:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a KV entry")
        (hlen,) = struct.unpack("<I", f.read(4))
        if hlen > MAX_HEADER:
            raise ValueError("header too large")
        raw = f.read(hlen)
        h = msgpack.unpackb(raw, raw=False)
        if not isinstance(h, dict) or h.get("fp") != self.fp:
            raise ValueError("made for another model or KV format")
        tb, size = bytes(h["tokens"]), int(h["size"])
        if zlib.crc32(tb + struct.pack("<Q", size)) != h.get("hcrc"):
            raise ValueError("header checksum mismatch")
        if file_size != len(MAGIC) + 4 + hlen + size:
            raise ValueError("truncated or padded")
        ns = h.get("ns", "")
        if not isinstance(ns, str) or len(ns) > 64:
            raise ValueError("bad namespace")
        tokens = tuple(array("i", tb))
        marks = h.get("marks", [])
        if not isinstance(marks, list) or len(marks) > 64 or not all(
                isinstance(m, int) and 0 < m <= len(tokens) for m in marks):
            raise ValueError("bad checkpoint marks")
        return kv_key(tokens, ns), tokens, size, ns, tuple(marks)

    # -- the step's calls (the worker's main thread) ----------------------------------------
    def put(self, key: int, tokens, data: bytes, pinned: bool = False, ns: str = "",
            marks: tuple[int, ...] = ()) -> bool:
        """Queue an entry for writing; False (and reported dropped) when the writer is too
        far behind or the entry alone exceeds the cap."""
        with self._lock:
            if self._pending_bytes + len(data) > MAX_PENDING or len(data) > self.cap:
                self._dropped.append(key)
                return False
            old = self._pending.pop(key, None)
            self._pending_bytes += len(data) - (len(old) if old is not None else 0)
            self._pending[key] = data
        self._queue.put(("put", key, _tokens_bytes(tokens), data, pinned, ns, marks))
        return True

    def get(self, key: int) -> bytes | None:
        """The entry's state bytes, or None (missing; a corrupt file is deleted and reported)."""
        with self._lock:
            data = self._pending.get(key)
            if data is not None:
                return data
            e = self._entries.get(key)
        if e is None:
            return None
        p = self._path(key)
        try:
            with open(p, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(len(MAGIC))
                (hlen,) = struct.unpack("<I", f.read(4))
                h = msgpack.unpackb(f.read(hlen), raw=False)
                data = f.read()
            if size != len(MAGIC) + 4 + hlen + len(data) or len(data) != h["size"] or zlib.crc32(data) != h["crc"]:
                raise ValueError("checksum mismatch")
        except (OSError, ValueError, KeyError, TypeError, struct.error, msgpack.UnpackException) as e2:
            log.warning("KV entry %016x is corrupt (%s): deleted", key, e2)
            self._forget(key, p)
            return None
        with self._lock:
            if key in self._entries:
                self._entries[key].used = time.time()
        try:
            os.utime(p)  # least recently used survives a restart too
        except OSError:
            pass
        return data

    def reject(self, key: int) -> None:
        """A save that could not be made: the scheduler forgets the entry."""
        with self._lock:
            self._dropped.append(key)

    def drop(self, key: int) -> None:
        self._queue.put(("drop", key))

    def pin(self, key: int, pinned: bool) -> None:
        """A pinned entry is evicted last (an entry still queued is pinned once written)."""
        with self._lock:
            if pinned:
                self._pinned.add(key)
            else:
                self._pinned.discard(key)
            e = self._entries.get(key)
            if e is not None:
                e.pinned = pinned

    def take_dropped(self) -> tuple[list[int], int]:
        """(keys gone since the last call, bytes evicted for space since the last call)."""
        with self._lock:
            out, self._dropped = self._dropped, []
            ev, self._evicted_bytes = self._evicted_bytes, 0
        return out, ev

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued write is on disk (tests, shutdown)."""
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    # -- the writer thread ----------------------------------------------------------------
    def _writer(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if item[0] == "put":
                    self._write(*item[1:])
                elif item[0] == "drop":
                    self._forget(item[1], self._path(item[1]), report=False)
                elif item[0] == "flush":
                    item[1].set()
            except Exception:  # noqa: BLE001 -- the writer thread must outlive any one entry
                log.exception("KV writer failed on %s", item[0])

    def _write(self, key: int, tb: bytes, data: bytes, pinned: bool, ns: str = "", marks: tuple[int, ...] = ()) -> None:
        size = len(data)
        fields = {"fp": self.fp, "tokens": tb, "size": size, "crc": zlib.crc32(data),
                  "hcrc": zlib.crc32(tb + struct.pack("<Q", size))}
        if ns:
            fields["ns"] = ns
        if marks:
            fields["marks"] = list(marks)
        header = msgpack.packb(fields, use_bin_type=True)
        p = self._path(key)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")  # two processes may share a home
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                f.write(data)
            os.replace(tmp, p)
            with self._lock:
                self._entries[key] = _Entry(len(MAGIC) + 4 + len(header) + size, time.time(),
                                            pinned or key in self._pinned)
        except OSError as e:
            log.warning("could not write KV entry %016x: %s", key, e)
            self._unlink(tmp)
            with self._lock:
                self._dropped.append(key)
        finally:
            with self._lock:
                if self._pending.get(key) is data:
                    del self._pending[key]
                    self._pending_bytes -= size
        self._evict_over_cap()

    def _evict_over_cap(self) -> None:
        with self._lock:
            total = sum(e.nbytes for e in self._entries.values())
            if total <= self.cap:
                return
            order = sorted(self._entries.items(), key=lambda kv: (kv[1].pinned, kv[1].used))
            victims = []
            for key, e in order:
                if total <= self.cap:
                    break
                total -= e.nbytes
                victims.append((key, e.nbytes))
        for key, nbytes in victims:
            self._forget(key, self._path(key))
            with self._lock:
                self._evicted_bytes += nbytes

    def _forget(self, key: int, p: Path, report: bool = True) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._pinned.discard(key)
            data = self._pending.pop(key, None)
            if data is not None:
                self._pending_bytes -= len(data)
            if report:
                self._dropped.append(key)
        self._unlink(p)

    def _path(self, key: int) -> Path:
        return self.dir / f"{key:016x}.kv"

    @staticmethod
    def _unlink(p: Path) -> None:
        try:
            p.unlink()
        except OSError:
            pass
