"""The scheduler's KV tiers beyond the slots: the disk tier (its index, the saves due and the
restores in flight, what the worker reports about its store) and pins (prefixes kept warm in
a slot and pinned on disk).

Owned by the Scheduler (sched/scheduler.py), which hands it the slots it reads: the same
pure bookkeeping. Pins follow sched/pins.py; the worker learns which disk entries are
pinned from StepPlan.pins, sent after the plan's saves."""

from __future__ import annotations

from collections.abc import Sequence

from ..plan import Save, StepResult, kv_key
from . import rows
from .jobs import Counters, Job
from .kvdisk import BLOCK, MIN_ENTRY, DiskIndex
from .lanes import KvSlots
from .pins import Pin, Pins

MIN_RESTORE = BLOCK  # restore from disk only when it saves at least this much prefill over RAM
MIN_PIN = 16  # a shorter prefix is not worth a pinned slot


class Tiers:
    def __init__(self, counters: Counters, slots: KvSlots, pin_share: int):
        self.counters = counters
        self.slots = slots  # the scheduler's (read: what memory holds beside the disk)
        self.disk: DiskIndex | None = None  # the disk tier's index (None: the worker has no disk tier)
        self.marks_only = False  # entries restore only at their marks (ModelInfo.disk_marks)
        self.pins = Pins(pin_share)  # every lane must find an unpinned slot
        # seq -> (KV tokens, namespace) to save: a turn ended, a long prompt prefilled
        self.to_save: dict[int, tuple[list[int], str]] = {}
        self.loads: dict[int, dict[int, int]] = {}  # step -> {seq: disk key} restores in flight
        self.now = 0.0  # the engine's clock, as last passed to expire
        # (pin, prefix, namespace) the next plan pins on disk, and disk pin changes for it
        self._pin_wanted: list[tuple[Pin | None, list[int], str]] = []
        self._pin_ops: list[tuple[int, bool]] = []

    @property
    def has_work(self) -> bool:
        return bool(self._pin_wanted or self._pin_ops)

    def reset(self) -> None:
        """The worker is gone: nothing of its is in flight."""
        self.to_save.clear()
        self.loads.clear()

    # -- the disk tier ---------------------------------------------------------------------
    def restore_for(self, job: Job, tail_rows: int) -> tuple[int, int] | None:
        """(disk key, tokens) when restoring the job's prefix from disk saves at least
        MIN_RESTORE tokens of prefill over the best KV a slot holds; `tail_rows`: the row
        rules of --deterministic (sched/rows.py)."""
        if not self.disk:
            return None
        tokens = job.known()
        key, n = self.disk.match(tokens, job.cache_ns)
        n = rows.cached(job, n, tail_rows)  # the last token is fed again: its logits are needed
        if key is None or n < self.slots.best_match(tokens, Job.kv_tokens, ns=job.cache_ns)[1] + MIN_RESTORE:
            return None
        if self.marks_only:  # a recurrent state only where checkpointed, a sliding window's only whole
            n = max([0, *(m for m in self.disk.entries[key].marks if m <= n)])
            if n < self.slots.best_match(tokens, Job.kv_tokens, ns=job.cache_ns)[1] + MIN_RESTORE:
                return None
        return key, n

    def save(self, seq: int, tokens: list[int], ns: str, step: int, saves: list[Save], drops: list[int]) -> None:
        """Write a slot's KV (of namespace `ns`) to disk unless the disk tier already holds
        all but a block of it."""
        if self.disk is None or len(tokens) < MIN_ENTRY or self.disk.match(tokens, ns)[1] > len(tokens) - BLOCK:
            return
        key = kv_key(tokens, ns)
        saves.append(Save(seq, key, tuple(tokens), ns))
        drops.extend(self.disk.add(key, tokens, step, ns, self._marks(seq, len(tokens))))
        self.counters.kv_saves += 1

    def _marks(self, seq: int, n: int) -> tuple[int, ...]:
        """Where the saved state of slot seq's first n tokens can be cut (checkpoints; () for KV):
        its checkpoints, and n where the lane ends there (runtime/llamacpp.state_marks)."""
        if not self.marks_only:
            return ()
        s = self.slots[seq]
        end = (n,) if s.job is None and len(s.kv) == n else ()
        return tuple(sorted({*(p for p in s.marks if p <= n), *end}))

    def save_due(self, step: int, saves: list[Save], drops: list[int]) -> None:
        """The saves due (turns that ended, long prompts prefilled), into this plan."""
        for seq, (tokens, ns) in self.to_save.items():
            self.save(seq, tokens, ns, step, saves, drops)
        self.to_save.clear()

    def seed_disk(self, entries: list[tuple[int, tuple[int, ...], str, tuple[int, ...]]] | None) -> None:
        """A (new) worker's disk tier: index what it holds, (key, tokens, namespace, marks) per entry
        (None: it has none). Its store knows no pins: the pinned prefixes are pinned again
        with the next plan."""
        if entries is None:
            self.disk = None
            return
        self.disk = DiskIndex()
        for i, (key, tokens, ns, marks) in enumerate(entries):  # least recently used first
            if len(tokens) >= MIN_ENTRY:
                self.disk.add(key, tokens, -len(entries) + i, ns, marks)
        for pin in self.pins.by_name.values():
            pin.disk = None
            if pin.tokens:
                self._pin_wanted.append((pin, pin.tokens, pin.ns))

    def result(self, result: StepResult, loads: dict[int, int]) -> None:
        """What the step did to the store: bytes moved, entries dropped, restores that failed."""
        c = self.counters
        c.kv_saved_bytes += result.kvio.saved
        c.kv_restored_bytes += result.kvio.restored
        c.kv_evicted_bytes += result.kvio.evicted
        if self.disk is not None:
            for key in result.dropped:
                self.disk.remove(key)
            for seq in result.failed:
                if seq in loads:
                    self.disk.remove(loads[seq])

    # -- pins ------------------------------------------------------------------------------
    def pin_session(self, session: str, tokens: Sequence[int], ns: str = "") -> int:
        """Keep a session's latest context (`tokens`: what it holds now, in prefix-cache
        namespace `ns`) warm until it is unpinned; TooManyPins beyond the share. Returns how
        much of it a slot holds now (a running turn's slot counts once the turn ends)."""
        pin = self.pins.session(f"session:{session}", ns)
        src, n = self.slots.best_match(tokens, Job.kv_tokens, ns=ns)
        if src is not None and src.job is None and n >= MIN_PIN:
            pin.tokens = list(src.kv[:n])
        self._pin_wanted.append((pin, list(tokens), ns))
        return n

    def unpin_session(self, session: str) -> bool:
        pin = self.pins.unpin(f"session:{session}")
        if pin is None:
            return False
        if self.disk is not None:
            for key in {pin.disk, self.disk.match(pin.tokens, pin.ns)[0] if pin.tokens else None}:
                self._unpin_disk(key)
        return True

    def pinned(self, session: str) -> bool:
        return f"session:{session}" in self.pins

    def expire(self, now: float) -> None:
        """The engine's clock (monotonic seconds), once per loop: hints past their deadline
        leave memory."""
        self.now = now
        self.pins.expire(now)

    def keep_pinned(self, job: Job, kv: list[int]) -> None:
        """A turn ended with `kv` in its slot: a pinned session's pin moves to it; a cache
        hint pins the prefix it marked (in a slot while a share is free) for its TTL."""
        pin = self.pins.get(f"session:{job.session}") if job.session is not None else None
        if pin is not None:
            pin.tokens, pin.ns = list(kv), job.cache_ns
            self._pin_wanted.append((pin, pin.tokens, pin.ns))
        if job.cache is not None and MIN_PIN <= job.cache[0] <= len(kv):
            prefix = kv[:job.cache[0]]
            self.pins.hint(prefix, self.now + job.cache[1], job.cache_ns)
            self._pin_wanted.append((None, prefix, job.cache_ns))

    def _unpin_disk(self, key: int | None) -> None:
        if key is not None and self.disk is not None and key in self.disk:
            self.disk.entries[key].pinned = False
            self._pin_ops.append((key, False))

    def disk_pins(self, saves: list[Save]) -> tuple[tuple[int, bool], ...]:
        """The plan's disk pin changes, after its saves: the entries holding pinned prefixes
        (a session's previous entry unpinned), and saves that inherited a superseded pin."""
        wanted, self._pin_wanted = self._pin_wanted, []
        out: dict[int, bool] = {}
        out.update(self._pin_ops)
        self._pin_ops = []
        if self.disk is None:
            return tuple(out.items())
        for pin, tokens, ns in wanted:
            if pin is not None and self.pins.get(pin.name) is not pin:
                continue  # unpinned since
            key, n = self.disk.match(tokens, ns)
            if key is None or n < MIN_ENTRY:
                continue
            if pin is not None:
                old = pin.disk
                if old is not None and old != key and old in self.disk:
                    self.disk.entries[old].pinned = False
                    out[old] = False
                pin.disk = key
            self.disk.entries[key].pinned = True
            out[key] = True
        for sv in saves:
            e = self.disk.entries.get(sv.key)
            if e is not None and e.pinned:
                out[sv.key] = True
        return tuple(out.items())
