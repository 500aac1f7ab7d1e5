"""The scheduler's KV tiers beyond the slots: the disk tier (saves, restores, what the worker
reports about its store) and pins (prefixes kept warm in a slot and pinned on disk).

A mixin of Scheduler (sched/scheduler.py): the same pure bookkeeping, kept in its own module
by concept. Pins follow sched/pins.py; the worker learns which disk entries are pinned from
StepPlan.pins, sent after the plan's saves."""

from __future__ import annotations

from collections.abc import Sequence

from ..plan import Save, StepResult, kv_key
from ..request import Qos
from .jobs import Counters, Job, JobStatus
from .kvdisk import BLOCK, MIN_ENTRY, DiskIndex
from .lanes import KvSlots
from .pins import Pin, Pins
from .queues import WaitQueue

MIN_RESTORE = BLOCK  # restore from disk only when it saves at least this much prefill over RAM
MIN_PIN = 16  # a shorter prefix is not worth a pinned slot


class KvTiers:
    slots: KvSlots
    disk: DiskIndex | None
    counters: Counters
    running: dict[int, Job]
    waiting: WaitQueue
    pins: Pins
    _to_close: list[int]
    _step: int
    _now: float  # the engine's clock, as last passed to expire_pins
    _pin_wanted: list[tuple[Pin | None, list[int], str]]  # (pin, prefix, namespace) the next plan pins on disk
    _pin_ops: list[tuple[int, bool]]  # disk pin changes for the next plan
    tail_rows: int

    def _tail(self, job: Job) -> int:
        """The fewest rows of the prefill run that samples the job's next token: a new turn's
        prompt runs in runs of at least `tail_rows` rows (where it has as many), the one that
        samples included, however much of it a slot or the disk held: 2 with --deterministic
        (llama.cpp computes a row of a one-row run differently). A continued turn's next token
        comes from a run of one row, as a decode's does."""
        return 1 if job.output or job.prior else self.tail_rows

    def _solo(self, step: int) -> bool | None:
        """With --deterministic (tail_rows 2), a prefill run has its step to itself (True; its
        decodes every other step, False): llama.cpp splits a batch of several sequences so that
        each has as many rows in a micro-batch, which would cut the prefill's rows differently
        by what runs beside it. None: no such rule (or nothing to prefill)."""
        if self.tail_rows < 2 or not any(j.status == JobStatus.PREFILLING for j in self.running.values()):
            return None
        decoding = any(j.status == JobStatus.DECODING for j in self.running.values())
        return step % 2 == 0 or not decoding

    # -- the disk tier ---------------------------------------------------------------------
    def _restore_for(self, job: Job) -> tuple[int, int] | None:
        """(disk key, tokens) when restoring the job's prefix from disk saves at least
        MIN_RESTORE tokens of prefill over the best KV a slot holds."""
        if not self.disk:
            return None
        tokens = job.known()
        key, n = self.disk.match(tokens, job.cache_ns)
        n = min(n, len(tokens) - self._tail(job))  # the last token is fed again: its logits are needed
        if key is None or n < self.slots.best_match(tokens, Job.kv_tokens, ns=job.cache_ns)[1] + MIN_RESTORE:
            return None
        return key, n

    def _chat_prefilling(self) -> bool:
        return any(j.qos == Qos.INTERACTIVE and j.status == JobStatus.PREFILLING for j in self.running.values())

    def _save(self, seq: int, tokens: list[int], ns: str, step: int, saves: list[Save], drops: list[int]) -> None:
        """Write a slot's KV (of namespace `ns`) to disk unless the disk tier already holds
        all but a block of it."""
        if self.disk is None or len(tokens) < MIN_ENTRY or self.disk.match(tokens, ns)[1] > len(tokens) - BLOCK:
            return
        key = kv_key(tokens, ns)
        saves.append(Save(seq, key, tuple(tokens), ns))
        drops.extend(self.disk.add(key, tokens, step, ns))
        self.counters.kv_saves += 1

    def seed_disk(self, entries: list[tuple[int, tuple[int, ...], str]] | None) -> None:
        """A (new) worker's disk tier: index what it holds, (key, tokens, namespace) per entry
        (None: it has none). Its store knows no pins: the pinned prefixes are pinned again
        with the next plan."""
        if entries is None:
            self.disk = None
            return
        self.disk = DiskIndex()
        for i, (key, tokens, ns) in enumerate(entries):  # least recently used first
            if len(tokens) >= MIN_ENTRY:
                self.disk.add(key, tokens, -len(entries) + i, ns)
        for pin in self.pins.by_name.values():
            pin.disk = None
            if pin.tokens:
                self._pin_wanted.append((pin, pin.tokens, pin.ns))

    def _disk_result(self, result: StepResult, loads: dict[int, int]) -> None:
        c = self.counters
        c.kv_saved_bytes += result.kvio.saved
        c.kv_restored_bytes += result.kvio.restored
        c.kv_evicted_bytes += result.kvio.evicted
        if self.disk is not None:
            for key in result.dropped:
                self.disk.remove(key)
        for seq in result.failed:  # the lane's KV is gone (a restore that failed)
            if self.disk is not None and seq in loads:
                self.disk.remove(loads[seq])
            slot = self.slots[seq]
            job = slot.job
            slot.kv = []
            if job is None:
                continue
            # back to the front of its queue, to be prefilled from what it knows: as a
            # preempted job, it draws the same tokens
            self.running.pop(seq, None)
            self._to_close.append(seq)
            slot.job = None
            if seq in loads:
                job.cached = None  # it was not restored after all
            job.status, job.pending, job.seq = JobStatus.WAITING, 0, None
            self.waiting.push_front(job, self._step)

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

    def expire_pins(self, now: float) -> None:
        """The engine's clock (monotonic seconds), once per loop: hints past their deadline
        leave memory."""
        self._now = now
        self.pins.expire(now)

    def _keep_pinned(self, job: Job, kv: list[int]) -> None:
        """A turn ended with `kv` in its slot: a pinned session's pin moves to it; a cache
        hint pins the prefix it marked (in a slot while a share is free) for its TTL."""
        pin = self.pins.get(f"session:{job.session}") if job.session is not None else None
        if pin is not None:
            pin.tokens, pin.ns = list(kv), job.cache_ns
            self._pin_wanted.append((pin, pin.tokens, pin.ns))
        if job.cache is not None and MIN_PIN <= job.cache[0] <= len(kv):
            prefix = kv[:job.cache[0]]
            self.pins.hint(prefix, self._now + job.cache[1], job.cache_ns)
            self._pin_wanted.append((None, prefix, job.cache_ns))

    def _unpin_disk(self, key: int | None) -> None:
        if key is not None and self.disk is not None and key in self.disk:
            self.disk.entries[key].pinned = False
            self._pin_ops.append((key, False))

    def _disk_pins(self, saves: list[Save]) -> tuple[tuple[int, bool], ...]:
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
