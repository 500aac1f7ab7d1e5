"""KV slots: the worker's KV sequences. A running job holds one; a free slot keeps the KV
its last job left behind, as a prefix-cache entry, until it is given to another job.

Choosing a slot for a new job: the slot whose KV shares the longest prefix with the job's
context (used in place if it is free, copied from if it is running), else a free slot by
eviction order: empty first, then entries never reused, then reused ones, least recently
used first, and slots that hold a pinned prefix (sched/pins.py) last. Running slots are
never evicted. A job matches only the KV of its own prefix-cache namespace (its key's, or
its cache_salt's: api/cache_ns.py), so no key learns from timing or `cached_tokens` what
another key's prompts hold.

Within each of those classes, a slot next to a running one comes before least recently
used. Slots are llama.cpp sequences, each with its own KV stream, and llama.cpp computes
only consecutive sequences together (runtime/llamacpp.by_seq): eight lanes decoding in
slots 0-7 are one graph compute a step, in slots 0 and 9-15 two, in pairs four (measured on
two cores: 110, 92, 74 tok/s). An entry evicted a little early is still on the disk tier,
which is on by default, and restored from there more cheaply than that loss.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..plan import CHECKPOINTS
from .prefix import common_prefix


@dataclass(eq=False)
class Slot:
    seq: int
    job: Any = None  # the running job, or None when free
    kv: list[int] = field(default_factory=list)  # tokens whose KV a free slot holds, from position 0
    hits: int = 0  # times this entry seeded a job
    last_used: int = 0
    persist: bool = True  # False: the KV is a store:false job's, never saved to the disk tier
    ns: str = ""  # the prefix-cache namespace of the job that left the KV
    # where the runtime checkpointed the lane's state (a model whose prefix cache is
    # "checkpoints": plan.CHECKPOINTS, runtime/checkpoints.py), by the rule it follows: the end of
    # every run of more than one token, the last CHECKPOINTS of them
    marks: list[int] = field(default_factory=list)

    def mark(self, pos: int) -> None:
        self.marks = sorted({*self.marks, pos})[-CHECKPOINTS:]

    def keep_marks(self, n: int) -> None:
        """The lane keeps its first n tokens: its checkpoints past them go."""
        self.marks = [p for p in self.marks if p <= n]

    def namespace(self) -> str:
        """The namespace of the KV it holds: its running job's, else its last job's."""
        return self.job.cache_ns if self.job is not None else self.ns


class KvSlots:
    def __init__(self, n: int):
        if n < 1:
            raise ValueError("need at least one KV slot")
        self.slots = [Slot(i) for i in range(n)]
        # the runtime's prefix cache is "checkpoints" (ModelInfo.prefix_cache): a lane is cut
        # only where its state was saved, or at a free lane's end
        self.checkpoints = False

    def ran(self, seq: int, n: int, end: int) -> None:
        """A run of n tokens ending at `end` was planned in lane seq: with checkpoints, the
        runtime saves the lane's state there when n > 1 (plan.CHECKPOINTS), and so it is marked."""
        if n > 1 and self.checkpoints:
            self.slots[seq].mark(end)

    def cut(self, s: Slot, n: int) -> int:
        """The longest prefix of at most n tokens that slot s's lane can be cut to: n for a KV
        cache; with checkpoints, the deepest checkpoint at or below n, or a free lane's end."""
        if not self.checkpoints or n <= 0:
            return n
        end = len(s.kv) if s.job is None and len(s.kv) <= n else 0
        return max([end, *(p for p in s.marks if p <= n)])

    def clear(self) -> None:
        """Every slot empty (the worker and its KV are gone)."""
        self.slots = [Slot(i) for i in range(len(self.slots))]

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, seq: int) -> Slot:
        return self.slots[seq]

    @property
    def free(self) -> list[Slot]:
        return [s for s in self.slots if s.job is None]

    def best_match(self, tokens: Sequence[int], held: Callable[[Any], Sequence[int]],
                   exclude: int | None = None, ns: str = "") -> tuple[Slot | None, int]:
        """(slot, n): the slot of namespace `ns` whose KV holds the longest prefix of tokens;
        `held(job)` gives the KV tokens of a running slot's job."""
        best, n = None, 0
        for s in self.slots:
            if s.seq == exclude or s.namespace() != ns:
                continue
            kv = held(s.job) if s.job is not None else s.kv
            m = self.cut(s, common_prefix(tokens, kv))
            if m > n or (m == n and m > 0 and best is not None and best.job is not None and s.job is None):
                best, n = s, m  # on a tie, a free slot (used in place, no copy) wins
        return best, n

    def evictable(self, avoid: Slot | None = None, keep: Container[int] = ()) -> Slot | None:
        """The free slot to give a new job; slots in `keep` (pinned) only when no other is free."""
        cands = [s for s in self.slots if s.job is None and s is not avoid]
        if not cands:
            return None
        running = {s.seq for s in self.slots if s.job is not None}
        return min(cands, key=lambda s: (s.seq in keep, bool(s.kv), s.hits > 0,
                                         -((s.seq - 1) in running) - ((s.seq + 1) in running), s.last_used))
