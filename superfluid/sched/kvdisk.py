"""The scheduler's index of the disk tier: which token prefixes have their KV on disk.

The worker owns the files (runtime/kvstore.py); this index mirrors them so the scheduler can
plan a restore like a prefill chunk. Each entry is the KV of one token sequence from position
0. It is found by a hash chain over the tokens in blocks of BLOCK: block i's hash covers every
token before its end, so one dict lookup per block finds the entries that share a prompt's
first i blocks, and the exact shared length (into the last, partial block) comes from
comparing the tokens. The chain's hashes also summarise what a node holds for the fleet.

An entry whose tokens are a prefix of a newer one (the previous turn of the same
conversation) is superseded: `add` returns it for the worker to delete; the newer one holds
all it did, so it inherits its pin."""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .prefix import common_prefix

BLOCK = 64  # tokens per hash-chain block: the lookup's granularity (matches are exact)
MIN_ENTRY = BLOCK  # shorter contexts are cheaper to prefill than to keep
MAX_CANDIDATES = 16  # entries compared token by token in one lookup


def block_hashes(tokens: Sequence[int], ns: str = "") -> list[int]:
    """The chain: one 63-bit hash per full block, each over every token up to its end, keyed
    by the prefix cache's namespace (request.GenRequest.cache_ns): the same tokens in two
    namespaces share no hash."""
    raw = array("i", tokens).tobytes()
    out: list[int] = []
    h = b""
    key = ns.encode()
    step = BLOCK * 4
    for i in range(0, len(raw) - step + 1, step):
        h = hashlib.blake2b(h + raw[i:i + step], digest_size=8, key=key).digest()
        out.append(int.from_bytes(h, "little") >> 1)
    return out


@dataclass(eq=False)
class DiskEntry:
    key: int
    tokens: array
    blocks: list[int]
    used: int = 0  # the step it was last saved or restored
    pinned: bool = False
    ns: str = ""  # the prefix cache's namespace
    marks: tuple[int, ...] = ()  # where a checkpointed state can be cut (sched/lanes.Slot.marks)


class DiskIndex:
    def __init__(self) -> None:
        self.entries: dict[int, DiskEntry] = {}
        self._by_block: dict[int, set[int]] = {}  # block hash -> entries holding that chain
        self._by_last: dict[int, set[int]] = {}  # an entry's last block hash -> entries ending there

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: int) -> bool:
        return key in self.entries

    @property
    def tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries.values())

    def add(self, key: int, tokens: Sequence[int], step: int = 0, ns: str = "",
            marks: tuple[int, ...] = ()) -> list[int]:
        """Index an entry (of namespace `ns`); returns the keys of entries it supersedes
        (removed here): only its own namespace's, as the hash chain finds only those."""
        if key in self.entries:
            self.entries[key].used = step
            return []
        blocks = block_hashes(tokens, ns)
        if not blocks:
            raise ValueError(f"an entry needs at least {BLOCK} tokens")
        older = [k for b in blocks for k in self._by_last.get(b, ())
                 if len(self.entries[k].tokens) <= len(tokens)
                 and common_prefix(tokens, self.entries[k].tokens) == len(self.entries[k].tokens)]
        pinned = any(self.entries[k].pinned for k in older)
        for k in older:
            self.remove(k)
        self.entries[key] = DiskEntry(key, array("i", tokens), blocks, step, pinned, ns, marks)
        for b in blocks:
            self._by_block.setdefault(b, set()).add(key)
        self._by_last.setdefault(blocks[-1], set()).add(key)
        return older

    def remove(self, key: int) -> None:
        e = self.entries.pop(key, None)
        if e is None:
            return
        for index, bs in ((self._by_block, e.blocks), (self._by_last, e.blocks[-1:])):
            for b in bs:
                keys = index.get(b)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[b]

    def match(self, tokens: Sequence[int], ns: str = "") -> tuple[int | None, int]:
        """(key, n): the entry of namespace `ns` that holds the longest prefix of tokens, and
        its length."""
        blocks = block_hashes(tokens, ns)
        depth = 0
        while depth < len(blocks) and blocks[depth] in self._by_block:
            depth += 1
        best, n = None, 0
        for k in self._candidates(blocks, depth):
            if self.entries[k].ns != ns:
                continue  # a 63-bit collision across namespaces: never a match
            m = common_prefix(tokens, self.entries[k].tokens)
            if m > n:
                best, n = k, m
        return best, n

    def _candidates(self, blocks: list[int], depth: int) -> Iterable[int]:
        """Entries sharing the first `depth` blocks (the most recently used first, bounded)."""
        if depth == 0:
            return []
        keys = self._by_block.get(blocks[depth - 1], set())
        return heapq.nlargest(MAX_CANDIDATES, keys, key=lambda k: self.entries[k].used)

    def summary(self, every: int = 4, limit: int = 4096) -> list[int]:
        """Block hashes at every `every`-th block of the most recently used entries: which
        prefixes this index holds, compactly (the fleet places sessions with it)."""
        out: list[int] = []
        seen: set[int] = set()
        for e in sorted(self.entries.values(), key=lambda e: -e.used):
            for b in e.blocks[every - 1::every]:
                if b not in seen:
                    seen.add(b)
                    out.append(b)
                    if len(out) >= limit:
                        return out
        return out
