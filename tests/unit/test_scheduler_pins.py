"""Pins (sched/pins.py, sched/tiers.py): a pinned session's or cache hint's prefix outlives
eviction pressure, only slots - lanes slots can be pinned, hints expire on the engine's
clock, and disk entries holding pinned prefixes are pinned through the plan."""

import pytest

from superfluid.errors import TooManyPins
from superfluid.plan import Sampled, StepPlan, StepResult, kv_key
from superfluid.request import SamplingParams
from superfluid.runtime.kvstore import KvStore
from superfluid.sched.kvdisk import BLOCK, DiskIndex
from superfluid.sched.scheduler import Job, Scheduler

EOG = 0


def toks(seed: int, n: int) -> list[int]:
    return [1000 + seed * 1000 + i for i in range(n)]


def sched(lanes: int = 1, slots: int = 3, disk: bool = False) -> Scheduler:
    s = Scheduler(lanes=lanes, n_ctx=4096, step_tokens=512, eog=frozenset({EOG}), slots=slots)
    s.prefill_budget = 512
    if disk:
        s.tiers.seed_disk([])
    return s


def run(s: Scheduler, job: Job) -> list[StepPlan]:
    """Add a job and run until nothing is left; returns the plans."""
    s.add(job)
    plans = []
    while s.has_work:
        plan = s.schedule()
        if plan is None:
            break
        plans.append(plan)
        s.update(plan, StepResult(plan.step, tuple(Sampled(r.seq, 7) for r in plan.runs if r.sample)))
    return plans


def turn(s: Scheduler, jid: str, prompt: list[int], **kw) -> tuple[list[StepPlan], list[int]]:
    """One finished turn of 2 tokens; returns its plans and the KV its slot keeps."""
    plans = run(s, Job(jid, list(prompt), SamplingParams(), 2, **kw))
    return plans, prompt + [7]  # the last sample is never fed back


def pressure(s: Scheduler, n: int, seed: int = 50) -> None:
    for i in range(n):
        turn(s, f"other{seed + i}", toks(seed + i, 30))


def first_open(plans: list[StepPlan]):
    return next(o for p in plans for o in p.opens)


def test_a_pinned_session_outlives_eviction_pressure_and_an_unpinned_one_does_not():
    s = sched(lanes=1, slots=3)
    _, kv_a = turn(s, "a1", toks(1, 40), session="A")
    _, kv_b = turn(s, "b1", toks(2, 40), session="B")
    assert s.tiers.pin_session("A", kv_a + [99]) == len(kv_a)  # the slot holds all of it
    pressure(s, 6)  # more conversations than slots
    plans, _ = turn(s, "a2", kv_a + [99] + toks(3, 5), session="A")
    assert first_open(plans).keep == len(kv_a)  # only the new tokens are prefilled
    plans, _ = turn(s, "b2", kv_b + [99] + toks(4, 5), session="B")
    assert first_open(plans).keep == 0  # the unpinned session was evicted


def test_the_pin_follows_the_sessions_latest_context():
    s = sched(lanes=1, slots=3)
    _, kv1 = turn(s, "a1", toks(1, 40), session="A")
    s.tiers.pin_session("A", kv1)
    _, kv2 = turn(s, "a2", kv1 + toks(2, 10), session="A")
    assert s.tiers.pins.get("session:A").tokens == kv2
    pressure(s, 6)
    plans, _ = turn(s, "a3", kv2 + toks(3, 5), session="A")
    assert first_open(plans).keep == len(kv2)


def test_a_job_sharing_less_than_a_pinned_prefix_copies_from_it():
    s = sched(lanes=1, slots=3)
    _, kv = turn(s, "a1", toks(1, 40), session="A")
    s.tiers.pin_session("A", kv)
    pinned_seq = next(sl.seq for sl in s.slots.slots if sl.kv == kv)
    plans, _ = turn(s, "fork", kv[:30] + toks(2, 10))
    copy = next(c for p in plans for c in p.copies)
    assert (copy.src, copy.n) == (pinned_seq, 30) and copy.dst != pinned_seq
    assert s.slots[pinned_seq].kv == kv  # not cut into


def test_only_slots_minus_lanes_can_be_pinned():
    s = sched(lanes=2, slots=3)  # one pin
    _, kv = turn(s, "a1", toks(1, 40), session="A")
    s.tiers.pin_session("A", kv)
    with pytest.raises(TooManyPins) as e:
        s.tiers.pin_session("B", toks(2, 40))
    assert e.value.status == 409 and e.value.code == "too_many_pins"
    assert s.tiers.pin_session("A", kv) == len(kv)  # pinning again is fine
    assert s.tiers.unpin_session("A") and not s.tiers.unpin_session("A")
    s.tiers.pin_session("B", toks(2, 40))
    with pytest.raises(TooManyPins):
        sched(lanes=2, slots=2).tiers.pin_session("A", kv)  # no share at all


def test_cache_hints_take_free_shares_only_and_a_session_pin_takes_a_hints_share():
    s = sched(lanes=1, slots=2)  # one pin
    s.tiers.expire(100.0)
    turn(s, "h1", toks(1, 40), cache=(30, 300.0))
    assert [p.until for p in s.tiers.pins.by_name.values()] == [400.0]
    turn(s, "h2", toks(2, 40), cache=(30, 300.0))
    assert len(s.tiers.pins) == 1 and s.tiers.pins.by_name[next(iter(s.tiers.pins.by_name))].tokens == toks(1, 30)
    # the same conversation's next turn marks a longer prefix: it takes over the share
    _, kv = turn(s, "h3", toks(1, 40) + [7, 5, 6], cache=(42, 300.0))
    assert [p.tokens for p in s.tiers.pins.by_name.values()] == [kv[:42]]
    _, kv_a = turn(s, "a1", toks(3, 40), session="A")
    s.tiers.pin_session("A", kv_a)  # the hint's share goes to the session
    assert list(s.tiers.pins.by_name) == ["session:A"]


def test_a_cache_hint_keeps_its_prefix_warm_until_its_ttl_passes():
    s = sched(lanes=1, slots=3)
    s.tiers.expire(0.0)
    system = toks(1, 40)
    turn(s, "h1", system + toks(2, 5), cache=(40, 300.0))
    pressure(s, 4)

    def warm() -> bool:
        return any(sl.kv[:40] == system for sl in s.slots.slots)

    s.tiers.expire(299.0)
    assert warm() and len(s.tiers.pins) == 1  # within the TTL
    s.tiers.expire(301.0)
    assert len(s.tiers.pins) == 0
    pressure(s, 4, seed=70)
    assert not warm()  # evicted once it expired
    plans, _ = turn(s, "h3", system + toks(4, 5))
    assert first_open(plans).keep == 0


def test_disk_entries_of_pinned_prefixes_are_pinned_through_the_plan():
    s = sched(lanes=1, slots=3, disk=True)
    prompt = toks(1, 2 * BLOCK)
    _, kv1 = turn(s, "a1", prompt, session="A")
    key1 = kv_key(kv1)
    assert key1 in s.tiers.disk and not s.tiers.disk.entries[key1].pinned
    s.tiers.pin_session("A", kv1)
    plan = s.schedule()  # nothing else to do: a plan with only the pin
    assert plan is not None and plan.pins == ((key1, True),) and s.tiers.disk.entries[key1].pinned
    s.update(plan, StepResult(plan.step, ()))
    # the next turn supersedes the entry: the new one is pinned (and the old one dropped)
    plans, kv2 = turn(s, "a2", kv1 + toks(2, BLOCK), session="A")
    key2 = kv_key(kv2)
    assert key1 not in s.tiers.disk and s.tiers.disk.entries[key2].pinned
    assert any((key2, True) in p.pins for p in plans) and any(key1 in p.drops for p in plans)
    assert s.tiers.unpin_session("A")
    plan = s.schedule()
    assert plan.pins == ((key2, False),) and not s.tiers.disk.entries[key2].pinned


def test_a_cache_hints_disk_entry_stays_pinned_after_its_ttl():
    s = sched(lanes=1, slots=3, disk=True)
    s.tiers.expire(0.0)
    system = toks(1, 2 * BLOCK)
    plans, kv = turn(s, "h1", system + toks(2, 5), cache=(2 * BLOCK, 300.0))
    assert any((kv_key(kv), True) in p.pins for p in plans)
    s.tiers.expire(1000.0)
    assert len(s.tiers.pins) == 0 and s.tiers.disk.entries[kv_key(kv)].pinned


def test_a_new_worker_gets_the_pins_again():
    s = sched(lanes=1, slots=3, disk=True)
    _, kv = turn(s, "a1", toks(1, 2 * BLOCK), session="A")
    s.tiers.pin_session("A", kv)
    s.update(p := s.schedule(), StepResult(p.step, ()))
    s.reset()
    s.tiers.seed_disk([(kv_key(kv), tuple(kv), "", ())])  # the new worker's store knows no pins
    plan = s.schedule()
    assert plan.pins == ((kv_key(kv), True),)


def test_superseding_a_pinned_disk_entry_passes_its_pin_on():
    idx = DiskIndex()
    a = toks(1, BLOCK)
    idx.add(kv_key(a), a)
    idx.entries[kv_key(a)].pinned = True
    b = a + toks(2, BLOCK)
    assert idx.add(kv_key(b), b) == [kv_key(a)] and idx.entries[kv_key(b)].pinned
    c = toks(3, BLOCK)
    idx.add(kv_key(c), c)
    assert not idx.entries[kv_key(c)].pinned


def test_plan_pins_roundtrip():
    plan = StepPlan(3, pins=((5, True), (2**62, False)))
    assert StepPlan.from_wire(plan.to_wire()) == plan


def test_the_store_evicts_pinned_entries_last_even_when_pinned_while_queued(tmp_path):
    store = KvStore(tmp_path, "fp", 10_000)
    try:
        keys = []
        for i in range(3):
            t = toks(i, 4)
            store.put(kv_key(t), t, bytes(3000))
            keys.append(kv_key(t))
            if i == 0:
                store.pin(keys[0], True)  # maybe still queued for the writer
        store.flush()
        t = toks(9, 4)
        store.put(kv_key(t), t, bytes(3000))  # over the cap: one entry goes
        store.flush()
        dropped, _ = store.take_dropped()
        assert dropped == [keys[1]]  # the oldest unpinned one, not the pinned oldest
    finally:
        store.close()
