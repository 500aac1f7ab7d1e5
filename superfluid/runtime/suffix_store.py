"""The suffix drafter's outputs on disk (`<kv dir>/suffix/<model fingerprint>.bin`), so its
global trees outlive the worker: a restart, a crash or a model reload drafts from what was
produced before.

An append-only file of records, one per output when its lane is retired: the cache namespace,
the tokens and when the lane opened (`<HId` lengths and time, the namespace in UTF-8, int32
tokens). It is a cache, not the truth (the session log is): written without fsync, read
leniently (a torn or garbled record ends the read, never the worker), and rewritten with only
the live outputs when it has grown to twice their size. A file of another version (MAGIC) is
read as empty and rewritten.

Erasure reaches it (issue 54): the daemon's `forget_before(dir, t)` (a session purged, a
retention pass) drops every output of a lane opened before `t` from every file in the folder
and leaves `t` in its `forget` file, which each worker reads before it writes: a lane opened
before it never reaches the file, and its memory lets go of those outputs too
(runtime/suffix.py). Daemon and workers take the folder's `lock` around every write."""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# 2: written since lane opens carry their namespace across Link W (worker/protocol.py, 2).
# A file of version 1 filed every key's outputs under the shared namespace "": it is discarded.
# 3: each record says when its lane opened, so an erasure can reach it (version 2: discarded).
MAGIC = b"SFXOUT3\n"
HEAD = struct.Struct("<HId")
MAX_NS = 1024  # bytes of a namespace (they are short digests)
MAX_RECORD = 1 << 22  # tokens in one output
FORGET, LOCK = "forget", "lock"  # beside the files: the erasure's time, and the writers' lock

Record = tuple[str, array, float]  # (namespace, tokens, when its lane opened: unix seconds)


class OutputFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self.dir = os.path.dirname(path) or "."
        self.size = 0
        self._f: BinaryIO | None = None
        self._marker: tuple[int, float] = (-1, 0.0)  # (the forget file's mtime_ns, its time)

    def load(self) -> list[Record]:
        """The records, oldest first, up to the first one that is not whole and sound; none
        of a lane opened before the last erasure."""
        return [r for r in read(self.path) if r[2] >= self.cutoff()]

    def cutoff(self) -> float:
        """Outputs of lanes opened before this time are forgotten (0: none)."""
        try:
            mtime = os.stat(os.path.join(self.dir, FORGET)).st_mtime_ns
        except OSError:
            return self._marker[1]
        if mtime != self._marker[0]:
            self._marker = (mtime, _read_marker(self.dir))
        return self._marker[1]

    def rewrite(self, records: list[Record]) -> None:
        """The file holds exactly these records, but for those an erasure reached (written
        aside, then moved over it)."""
        self.close()
        try:
            with _locked(self.dir):
                cut = self.cutoff()
                _write(self.path, [r for r in records if r[2] >= cut])
            self.size = os.path.getsize(self.path)
        except OSError:
            self.size = 0  # unwritable: drafts go on from memory

    def append(self, ns: str, tokens: array, opened: float) -> None:
        try:
            with _locked(self.dir):
                if opened < self.cutoff():  # erased while its lane ran
                    return
                if self._f is not None and _replaced(self._f, self.path):  # the daemon rewrote it
                    self.close()
                if self._f is None:
                    self._f = open(self.path, "ab")
                    if self._f.tell() == 0:
                        self._f.write(MAGIC)
                rec = _record(ns, tokens, opened)
                self._f.write(rec)
                self._f.flush()
                self.size = self._f.tell()
        except OSError:
            pass

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def forget_before(directory: str | Path, cutoff: float) -> int:
    """(the daemon) Every output of a lane opened before `cutoff` out of the folder's files,
    and `cutoff` left for the workers; the outputs dropped."""
    d = str(directory)
    if not os.path.isdir(d):
        return 0
    dropped = 0
    with _locked(d):
        cutoff = max(cutoff, _read_marker(d))
        tmp = os.path.join(d, f"{FORGET}.tmp")
        with open(tmp, "w") as f:
            f.write(repr(cutoff))
        os.replace(tmp, os.path.join(d, FORGET))
        for p in sorted(Path(d).glob("*.bin")):
            records = read(str(p))
            kept = [r for r in records if r[2] >= cutoff]
            if len(kept) != len(records) or not _current(str(p)):
                _write(str(p), kept)
                dropped += len(records) - len(kept)
    return dropped


def read(path: str) -> list[Record]:
    out: list[Record] = []
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return out
            while True:
                head = f.read(HEAD.size)
                if len(head) < HEAD.size:
                    break
                n_ns, n, opened = HEAD.unpack(head)
                if n_ns > MAX_NS or n > MAX_RECORD or opened != opened:  # (NaN: garbled)
                    break
                ns = f.read(n_ns)
                body = f.read(4 * n)
                if len(ns) < n_ns or len(body) < 4 * n:
                    break
                tokens = array("i")
                tokens.frombytes(body)
                if sys.byteorder != "little":
                    tokens.byteswap()
                if n:
                    out.append((ns.decode("utf-8", "replace"), tokens, opened))
    except OSError:
        return []
    return out


def _current(path: str) -> bool:
    """Whether the file is of this version (another one is rewritten: it may hold anything)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return True


def _write(path: str, records: list[Record]) -> None:
    tmp = f"{path}.tmp"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        for ns, tokens, opened in records:
            f.write(_record(ns, tokens, opened))
    os.replace(tmp, path)


def _read_marker(d: str) -> float:
    try:
        with open(os.path.join(d, FORGET)) as f:
            t = float(f.read(64))
        return t if t == t else 0.0
    except (OSError, ValueError):
        return 0.0


def _replaced(f: BinaryIO, path: str) -> bool:
    try:
        return os.fstat(f.fileno()).st_ino != os.stat(path).st_ino
    except OSError:
        return True


@contextlib.contextmanager
def _locked(d: str) -> Iterator[None]:
    os.makedirs(d, exist_ok=True)
    fd = os.open(os.path.join(d, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (the lock goes with it)


def _record(ns: str, tokens: array, opened: float) -> bytes:
    raw = ns.encode()[:MAX_NS]
    body = array("i", tokens[:MAX_RECORD])
    if sys.byteorder != "little":
        body.byteswap()
    return HEAD.pack(len(raw), len(body), opened) + raw + body.tobytes()
