"""Pins: token prefixes a client asked to keep warm (a session's pin, an Anthropic
cache_control hint).

A pin names a token prefix. The free slot whose KV starts with it is evicted last, and a job
that shares less than the whole prefix copies from that slot instead of cutting into it. Only
`limit` = slots - lanes pins may hold a slot, so a job always finds an unpinned free slot
when a lane is free. A session pin lasts until it is unpinned and follows the session's
latest context; a hint lasts until its deadline (on the engine's clock: the scheduler reads
none), refreshed each time a request sends it again. The disk entry that holds a pinned
prefix is pinned too (the store evicts it last); a hint's stays pinned after its deadline."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import TooManyPins
from .lanes import KvSlots


@dataclass(eq=False)
class Pin:
    name: str
    tokens: list[int]  # the prefix kept warm ([]: none in memory yet)
    until: float = math.inf  # the engine clock's deadline (inf: until unpinned)
    session: bool = False  # a session's pin (else a client's cache hint)
    disk: int | None = None  # the pinned disk entry (a session's, moved as it grows)
    ns: str = ""  # the prefix-cache namespace of the KV it keeps (sched/lanes.py)


def _starts(kv: Sequence[int], prefix: list[int]) -> bool:
    return len(kv) >= len(prefix) and list(kv[:len(prefix)]) == prefix


class Pins:
    def __init__(self, limit: int):
        self.limit = max(0, limit)  # most pins that hold a memory slot
        self.by_name: dict[str, Pin] = {}

    def __len__(self) -> int:
        return len(self.by_name)

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def get(self, name: str) -> Pin | None:
        return self.by_name.get(name)

    def session(self, name: str, ns: str = "") -> Pin:
        """A session's pin (created with no tokens yet). When every share is taken it takes a
        hint's (the one that expires first); TooManyPins when sessions hold them all."""
        pin = self.by_name.get(name)
        if pin is not None:
            pin.ns = ns
            return pin
        if len(self.by_name) >= self.limit:
            hints = [p for p in self.by_name.values() if not p.session]
            if not hints:
                raise TooManyPins(f"at most {self.limit} sessions can be pinned on this model (--kv-slots minus "
                                  f"--max-batch: every lane must find a slot); unpin one first", param="session")
            del self.by_name[min(hints, key=lambda p: p.until).name]
        pin = self.by_name[name] = Pin(name, [], session=True, ns=ns)
        return pin

    def unpin(self, name: str) -> Pin | None:
        return self.by_name.pop(name, None)

    def hint(self, tokens: list[int], until: float, ns: str = "") -> Pin | None:
        """Keep `tokens` warm until `until`, if a share is free or this hint extends one
        that holds a share (the same conversation's earlier prefix, whose share it takes
        over). None: no share is free (the disk entry is still pinned)."""
        older = [p for p in self.by_name.values() if not p.session and p.ns == ns and _starts(tokens, p.tokens)]
        for p in older:
            del self.by_name[p.name]
            until = max(until, p.until)
        if not older and len(self.by_name) >= self.limit:
            return None
        name = f"hint:{ns}:{len(tokens)}:{hash(tuple(tokens))}"
        pin = self.by_name[name] = Pin(name, list(tokens), until, ns=ns)
        return pin

    def expire(self, now: float) -> None:
        """Hints whose deadline passed leave memory (their disk entries stay pinned)."""
        for p in [p for p in self.by_name.values() if p.until <= now]:
            del self.by_name[p.name]

    def guarded(self, slots: KvSlots) -> dict[int, int]:
        """{seq: pinned length} of the free slots that hold a pinned prefix: one per pin,
        the most recently used one when several do."""
        out: dict[int, int] = {}
        free = sorted(slots.free, key=lambda s: -s.last_used)
        for p in self.by_name.values():
            n = len(p.tokens)
            if n == 0:
                continue
            for s in free:
                if s.ns == p.ns and _starts(s.kv, p.tokens):
                    out[s.seq] = max(out.get(s.seq, 0), n)
                    break
        return out
