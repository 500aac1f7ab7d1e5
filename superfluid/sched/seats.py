"""Where an admitted job's KV comes from (step 3 of the scheduler, sched/scheduler.py): the
longest prefix any slot holds (a free slot in place, a running one by copy) or the disk tier
(sched/tiers.py), so that only the rest is prefilled. A slot that holds a pinned prefix is
evicted last, and a job that would cut into it copies from it instead."""

from __future__ import annotations

from ..plan import Copy, Load, Save
from . import rows
from .jobs import Counters, Job
from .lanes import KvSlots, Slot
from .tiers import Tiers

MIN_COPY = 16  # a shorter shared prefix is cheaper to recompute than a KV stream copy


def seat(job: Job, slots: KvSlots, tiers: Tiers, counters: Counters, tail_rows: int, restore: tuple[int, int] | None,
         step: int, copies: list[Copy], pinned: set[int], loads: list[Load], saves: list[Save],
         drops: list[int]) -> tuple[Slot, int, int]:
    """(the slot the job opens in, the KV it keeps there, the prompt tokens it need not prefill).
    `tail_rows`: the row rules of --deterministic (sched/rows.py); `restore`: (disk key, tokens) when the
    disk tier holds more than memory (Tiers.restore_for). Copies, restores and the saves of
    what an eviction would lose go into this step's lists; slots copied from are `pinned`."""
    tokens = job.known()
    src, n = slots.best_match(tokens, Job.kv_tokens, ns=job.cache_ns)
    n = rows.cached(job, n, tail_rows)  # the last token is fed again: its logits are needed
    if src is not None:
        n = slots.cut(src, n)  # (a recurrent state: where the lane was checkpointed)
    pins = tiers.pins
    guard = pins.guarded(slots) if pins else {}  # {seq: pinned length}
    if src is not None and n < MIN_COPY and (src.job is not None or 2 * n < len(src.kv)):
        # a few shared tokens (a chat template's header) are worth neither a copy nor
        # most of a longer cache entry
        src, n = None, 0
    if restore is not None:  # the disk tier holds a longer prefix than any slot
        src = None
        free = slots.evictable(keep=guard)
        assert free is not None, "a free lane always has a free slot"
        slot, keep, (key, n) = free, 0, restore
        loads.append(Load(slot.seq, key, n))
        tiers.disk.entries[key].used = step  # type: ignore[union-attr]
        if job.cached is None:
            counters.restores += 1
            counters.restored_tokens += n
    elif src is not None and src.job is None and n > 0 and n >= guard.get(src.seq, 0):
        slot, keep = src, n
    else:  # a running slot, or a pinned one this job would cut into: copied from
        free = slots.evictable(avoid=src, keep=guard)
        assert free is not None, "a free lane always has a free slot"
        slot = free
        keep = 0
        if src is not None:
            copies.append(Copy(src.seq, slot.seq, n))
            pinned.add(src.seq)
            src.hits += 1
            counters.coalesced += 1
    if tiers.disk is not None and job.cached is None:
        counters.disk_lookups += 1
    if slot.kv and slot is not src:
        counters.evictions += 1
        if slot.persist:
            tiers.save(slot.seq, slot.kv, slot.ns, step, saves, drops)  # before the open wipes it
    if slot is src:
        slot.hits += 1
        slot.keep_marks(keep)
    elif restore is not None:  # a restored lane has the entry's checkpoints up to n
        slot.marks = [p for p in tiers.disk.entries[restore[0]].marks if p <= n]  # type: ignore[union-attr]
    else:  # a copy takes its source's checkpoints up to n; a cold lane has none
        slot.marks = [p for p in src.marks if p <= n] if src is not None else []
    return slot, keep, n
