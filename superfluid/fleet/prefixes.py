"""Which prompt prefixes a node holds, for cache-aware placement (pure).

A node summarises the KV it holds (its memory slots: running lanes and free slots' cache
entries; and its disk tier's index) as the hash chain of sched/kvdisk.py sampled every
EVERY blocks (one hash per GRAIN tokens), most recently used first, at most LIMIT hashes.
It sends them with each NODE_STATUS in an optional NODE_PREFIXES message: `prefix`
(little-endian u64 bytes, 8 per hash) and `prefix_tokens` = GRAIN. A head that predates it
drops it; a node that never sends it is simply never warm.

Block i's hash covers every token up to the end of block i, so the head finds how much of
a prompt a node holds by hashing the prompt the same way and taking the deepest of its
sampled hashes present in the node's set (placement.depth, in GRAIN-token units)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence

from ..sched.kvdisk import BLOCK, block_hashes

EVERY = 4  # sample every 4th 64-token block: 256-token granularity
GRAIN = BLOCK * EVERY
LIMIT = 4096  # hashes per NODE_PREFIXES (32 KiB)


def wanted(tokens: Sequence[int], ns: str = "") -> list[int]:
    """The sampled hashes of a prompt in prefix-cache namespace `ns`, in order: hash i covers
    its first (i + 1) * GRAIN tokens."""
    return block_hashes(tokens, ns)[EVERY - 1::EVERY]


def summarize(memory: Iterable[tuple[Sequence[int], str]], disk: Sequence[int] = (),
              limit: int = LIMIT) -> list[int]:
    """Sampled hashes of the memory slots' (token list, namespace) pairs (most recent
    first), then the disk tier's summary, deduplicated, at most `limit`."""
    out: list[int] = []
    seen: set[int] = set()

    def add(hs: Iterable[int]) -> bool:
        for h in hs:
            if h not in seen:
                seen.add(h)
                out.append(h)
                if len(out) >= limit:
                    return False
        return True

    for tokens, ns in memory:
        if len(tokens) >= GRAIN and not add(wanted(tokens, ns)):
            return out
    add(disk)
    return out


def to_wire(hashes: Sequence[int]) -> bytes:
    a = array("Q", hashes)  # 8 bytes on every platform CPython supports
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def from_wire(body: dict) -> frozenset[int]:
    """The set a NODE_PREFIXES carries; empty for another granularity or garbage."""
    raw, grain = body.get("prefix"), body.get("prefix_tokens")
    if not isinstance(raw, bytes) or grain != GRAIN or len(raw) % 8 or len(raw) > 8 * 4 * LIMIT:
        return frozenset()
    a = array("Q")
    a.frombytes(raw)
    if sys.byteorder == "big":  # the wire is little-endian
        a.byteswap()
    return frozenset(a)


class NodeSummary:
    """The node's side: its engine's summary, recomputed only when the engine stepped or its
    disk index changed since the last call (it goes every 2 s to every head). {} when the
    engine has no scheduler (a pipeline stage)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._wire: dict = {}

    def fields(self, engine) -> dict:
        sched = getattr(engine, "sched", None)
        if sched is None:
            return {}
        disk = sched.tiers.disk
        key = (getattr(engine, "steps", 0), id(disk), len(disk) if disk is not None else -1,
               disk.tokens if disk is not None else 0)
        if key != self._key:
            slots = sorted(sched.slots.slots, key=lambda s: (s.job is None, -s.last_used))
            memory = [(s.job.kv_tokens() if s.job is not None else s.kv, s.namespace()) for s in slots]
            hashes = summarize(memory, disk.summary(EVERY, LIMIT) if disk is not None else ())
            self._key, self._wire = key, {"prefix": to_wire(hashes), "prefix_tokens": GRAIN}
        return dict(self._wire)
