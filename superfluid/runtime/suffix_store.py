"""The suffix drafter's outputs on disk (`<kv dir>/suffix-<model fingerprint>.bin`), so its
global trees outlive the worker: a restart, a crash or a model reload drafts from what was
produced before.

An append-only file of records, one per output when its lane is retired: the cache namespace
and the tokens (`<HI` lengths, the namespace in UTF-8, int32 tokens). It is a cache, not the
truth (the session log is): written without fsync, read leniently (a torn or garbled record
ends the read, never the worker), and rewritten with only the live outputs when it has grown
to twice their size. A file of another version (MAGIC) is read as empty and rewritten."""

from __future__ import annotations

import os
import struct
import sys
from array import array
from typing import BinaryIO

# 2: written since lane opens carry their namespace across Link W (worker/protocol.py, 2).
# A file of version 1 filed every key's outputs under the shared namespace "": it is discarded.
MAGIC = b"SFXOUT2\n"
HEAD = struct.Struct("<HI")
MAX_NS = 1024  # bytes of a namespace (they are short digests)
MAX_RECORD = 1 << 22  # tokens in one output


class OutputFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self.size = 0
        self._f: BinaryIO | None = None

    def load(self) -> list[tuple[str, array]]:
        """The records, oldest first, up to the first one that is not whole and sound."""
        out: list[tuple[str, array]] = []
        try:
            with open(self.path, "rb") as f:
                if f.read(len(MAGIC)) != MAGIC:
                    return out
                while True:
                    head = f.read(HEAD.size)
                    if len(head) < HEAD.size:
                        break
                    n_ns, n = HEAD.unpack(head)
                    if n_ns > MAX_NS or n > MAX_RECORD:
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
                        out.append((ns.decode("utf-8", "replace"), tokens))
        except OSError:
            return []
        return out

    def rewrite(self, records: list[tuple[str, array]]) -> None:
        """The file holds exactly these records (written aside, then moved over it)."""
        self.close()
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(MAGIC)
                for ns, tokens in records:
                    f.write(_record(ns, tokens))
            os.replace(tmp, self.path)
            self.size = os.path.getsize(self.path)
        except OSError:
            self.size = 0  # unwritable: drafts go on from memory

    def append(self, ns: str, tokens: array) -> None:
        try:
            if self._f is None:
                self._f = open(self.path, "ab")
                if self._f.tell() == 0:
                    self._f.write(MAGIC)
            rec = _record(ns, tokens)
            self._f.write(rec)
            self._f.flush()
            self.size += len(rec)
        except OSError:
            pass

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _record(ns: str, tokens: array) -> bytes:
    raw = ns.encode()[:MAX_NS]
    body = array("i", tokens[:MAX_RECORD])
    if sys.byteorder != "little":
        body.byteswap()
    return HEAD.pack(len(raw), len(body)) + raw + body.tobytes()
