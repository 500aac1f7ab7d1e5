"""The disk tier as the scheduler sees it: the block index, and how saves and restores are
planned (sched/kvdisk.py, sched/scheduler.py)."""

from superfluid.plan import KvIo, Sampled, StepPlan, StepResult, kv_key
from superfluid.request import FinishReason, Qos, SamplingParams
from superfluid.sched.kvdisk import BLOCK, DiskIndex, block_hashes
from superfluid.sched.scheduler import Job, JobStatus, Scheduler

EOG = 0


def toks(seed: int, n: int) -> list[int]:
    return [1000 + (seed * 7919 + i * 31) % 5000 for i in range(n)]


# -- the index -----------------------------------------------------------------------------


def test_block_hashes_chain_over_every_token_before_the_block_end():
    a = toks(1, 3 * BLOCK + 10)
    b = a[:BLOCK] + [9] + a[BLOCK + 1:]  # differs in block 1
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == 3  # full blocks only
    assert ha[0] == hb[0] and ha[1] != hb[1] and ha[2] != hb[2]  # a chain: the change carries on
    assert block_hashes(a[:BLOCK - 1]) == []


def test_match_finds_the_longest_prefix_down_to_the_token():
    idx = DiskIndex()
    conv = toks(2, 300)
    idx.add(kv_key(conv), conv, step=1)
    other = toks(3, 200)
    idx.add(kv_key(other), other, step=2)
    # the next turn of the conversation: everything stored is shared, into the partial block
    key, n = idx.match(conv + toks(4, 50))
    assert (key, n) == (kv_key(conv), 300)
    # a prompt that leaves the stored one mid-block: exact length, not rounded to a block
    fork = conv[:150] + [7, 7, 7] + conv[153:]
    assert idx.match(fork) == (kv_key(conv), 150)
    assert idx.match(toks(5, 400)) == (None, 0)


def test_an_entry_is_found_only_in_its_own_namespace():
    """The disk tier is no oracle across keys either: the same tokens saved in namespace "a"
    are not found from "b" or the shared one, and do not supersede their entries."""
    idx = DiskIndex()
    conv = toks(2, 300)
    idx.add(kv_key(conv, "a"), conv, step=1, ns="a")
    assert kv_key(conv, "a") != kv_key(conv) and block_hashes(conv, "a") != block_hashes(conv)
    assert idx.match(conv + [5]) == (None, 0)
    assert idx.match(conv + [5], "b") == (None, 0)
    assert idx.match(conv + [5], "a") == (kv_key(conv, "a"), 300)
    longer = conv + toks(6, 100)
    assert idx.add(kv_key(longer), longer, step=2) == []  # the shared namespace's: "a"'s entry stays
    assert idx.add(kv_key(longer, "a"), longer, step=3, ns="a") == [kv_key(conv, "a")]
    assert idx.match(conv[:BLOCK - 1]) == (None, 0)  # not one full block: no lookup


def test_a_longer_turn_supersedes_its_prefix_and_remove_forgets():
    idx = DiskIndex()
    t1 = toks(6, 130)
    idx.add(kv_key(t1), t1)
    t2 = t1 + toks(7, 90)
    assert idx.add(kv_key(t2), t2) == [kv_key(t1)]
    assert kv_key(t1) not in idx and len(idx) == 1
    sibling = t1[:100] + toks(8, 100)  # shares a prefix but extends neither: both stay
    assert idx.add(kv_key(sibling), sibling) == []
    assert len(idx) == 2
    idx.remove(kv_key(t2))
    assert idx.match(t2) == (kv_key(sibling), 100)
    idx.remove(kv_key(sibling))
    assert idx.match(t2) == (None, 0) and idx._by_block == {} and idx._by_last == {}


def test_summary_lists_block_hashes_at_the_given_granularity():
    idx = DiskIndex()
    a = toks(9, 8 * BLOCK)
    idx.add(kv_key(a), a)
    assert idx.summary(every=4) == [block_hashes(a)[3], block_hashes(a)[7]]


# -- the scheduler ---------------------------------------------------------------------------


def sched(lanes: int = 2, slots: int = 2, n_ctx: int = 1024) -> Scheduler:
    s = Scheduler(lanes=lanes, n_ctx=n_ctx, step_tokens=512, eog=frozenset({EOG}), slots=slots)
    s.prefill_budget = 512
    s.tiers.seed_disk([])
    return s


def result(plan: StepPlan, failed: tuple[int, ...] = (), dropped: tuple[int, ...] = ()) -> StepResult:
    return StepResult(plan.step, tuple(Sampled(r.seq, 7) for r in plan.runs if r.sample and r.seq not in failed),
                      failed=failed, dropped=dropped, kvio=KvIo(10, 20, 0))


def run_to_end(s: Scheduler) -> list[StepPlan]:
    plans = []
    while s.has_work:
        plan = s.schedule()
        if plan is None:
            break
        plans.append(plan)
        s.update(plan, result(plan))
    return plans


def test_a_finished_turn_is_saved_and_its_next_turn_restored_when_ram_lost_it():
    s = sched()
    prompt = toks(10, 200)
    s.add(Job("a", list(prompt), SamplingParams(), 3))
    plans = run_to_end(s)
    saves = [sv for p in plans for sv in p.saves]
    assert len(saves) == 1
    kv = prompt + [7, 7]  # the prompt and what was fed back of the output
    assert saves[0].tokens == tuple(kv) and saves[0].key == kv_key(kv)
    assert kv_key(kv) in s.tiers.disk
    # the worker is replaced (RAM slots are empty); the disk index is what it reports
    s.reset()
    s.tiers.seed_disk([(kv_key(kv), tuple(kv), "", ())])
    nxt = kv + [7] + toks(11, 40)  # the next turn carries the whole conversation
    s.add(Job("b", list(nxt), SamplingParams(), 2))
    plan = s.schedule()
    assert [(ld.key, ld.n) for ld in plan.loads] == [(kv_key(kv), len(kv))]
    assert plan.opens[0].keep == 0 and plan.opens[0].seq == plan.loads[0].seq
    # only the rest is prefilled, from the restored length on
    assert [(r.pos, len(r.tokens)) for r in plan.runs] == [(len(kv), len(nxt) - len(kv))]
    assert s.jobs["b"].cached == len(kv)
    assert s.counters.restores == 1 and s.counters.restored_tokens == len(kv)
    before = s.counters.kv_restored_bytes
    s.update(plan, result(plan))
    assert s.counters.kv_restored_bytes == before + 20


def test_a_namespaced_turn_is_saved_in_its_namespace_and_restored_only_in_it():
    s = sched()
    prompt = toks(10, 200)
    s.add(Job("a", list(prompt), SamplingParams(), 3, cache_ns="key-a"))
    (save,) = [sv for p in run_to_end(s) for sv in p.saves]
    kv = prompt + [7, 7]
    assert (save.key, save.ns) == (kv_key(kv, "key-a"), "key-a")
    s.reset()
    s.tiers.seed_disk([(save.key, save.tokens, "key-a", ())])  # what the worker's store reports after a restart
    s.add(Job("b", kv + [7] + toks(11, 40), SamplingParams(), 2, cache_ns="key-b"))
    assert s.schedule().loads == () and s.jobs["b"].cached == 0
    s.add(Job("c", kv + [7] + toks(12, 40), SamplingParams(), 2, cache_ns="key-a"))
    assert [ld.key for ld in s.schedule().loads] == [save.key] and s.jobs["c"].cached == len(kv)


def test_ram_wins_when_it_holds_as_much_as_disk():
    s = sched()
    prompt = toks(12, 200)
    s.add(Job("a", list(prompt), SamplingParams(), 2))
    run_to_end(s)
    s.add(Job("b", prompt + [7, 99], SamplingParams(), 2))
    plan = s.schedule()
    assert plan.loads == () and plan.opens[0].keep > 0


def test_an_evicted_slot_is_saved_before_its_new_job_opens_it():
    s = sched(lanes=1, slots=1)
    s.tiers.disk = DiskIndex()
    a = toks(13, 150)
    s.add(Job("a", list(a), SamplingParams(), 2))
    plan = s.schedule()
    s.update(plan, result(plan))
    s.finish("a", FinishReason.CANCELLED)  # a cancel keeps its KV too
    b = toks(14, 100)
    s.add(Job("b", list(b), SamplingParams(), 2))
    plan = s.schedule()
    assert [sv.tokens for sv in plan.saves] == [tuple(a)]  # the turn-end save, before the open
    assert plan.opens[0].seq == plan.saves[0].seq
    # the same prefix is not written twice when the slot is evicted again
    s.update(plan, result(plan))
    assert len(s.tiers.disk) == 1


def test_a_failed_restore_requeues_the_job_to_prefill_from_scratch():
    s = sched()
    kv = toks(15, 300)
    s.tiers.seed_disk([(kv_key(kv), tuple(kv), "", ())])
    s.add(Job("a", kv + [5, 6], SamplingParams(), 2))
    plan = s.schedule()
    seq = plan.loads[0].seq
    s.update(plan, result(plan, failed=(seq,), dropped=(kv_key(kv),)))
    job = s.jobs["a"]
    assert job.status == JobStatus.WAITING and job.cached is None and kv_key(kv) not in s.tiers.disk
    plan = s.schedule()
    assert plan.loads == () and plan.opens[0].keep == 0
    assert plan.runs[0].pos == 0 and len(plan.runs[0].tokens) == len(kv) + 2
    assert job.cached == 0


def test_a_background_restore_waits_while_a_chat_prefills():
    s = sched(lanes=3, slots=3, n_ctx=2048)
    kv = toks(16, 300)
    s.tiers.seed_disk([(kv_key(kv), tuple(kv), "", ())])
    s.add(Job("chat", toks(17, 1100), SamplingParams(), 2, Qos.INTERACTIVE))  # over 2 steps of 512
    s.add(Job("bg", kv + [5], SamplingParams(), 2, Qos.BACKGROUND))
    plan = s.schedule()
    steps = 0
    while s.jobs["chat"].status == JobStatus.PREFILLING or steps == 0:
        assert plan.loads == () and s.jobs["bg"].status == JobStatus.WAITING
        s.update(plan, result(plan))
        plan = s.schedule()
        steps += 1
    assert steps >= 2
    # the chat's last chunk went out with that plan; it decodes now: the background job is restored
    assert plan.loads == ()
    s.update(plan, result(plan))
    plan = s.schedule()
    assert [ld.key for ld in plan.loads] == [kv_key(kv)]


def test_dropped_entries_leave_the_index_and_no_tier_means_no_saves():
    s = sched()
    kv = toks(18, 100)
    s.tiers.seed_disk([(kv_key(kv), tuple(kv), "", ())])
    s.add(Job("a", toks(19, 70), SamplingParams(), 2))
    plan = s.schedule()
    s.update(plan, result(plan, dropped=(kv_key(kv),)))
    assert len(s.tiers.disk) == 0
    s2 = Scheduler(lanes=1, n_ctx=1024, step_tokens=512, eog=frozenset({EOG}))
    s2.add(Job("a", toks(20, 200), SamplingParams(), 2))
    assert all(not p.saves and not p.loads for p in run_to_end(s2))


def test_a_long_prompt_is_saved_once_prefilled_while_its_job_runs():
    s = sched(n_ctx=2048)
    prompt = toks(21, 600)
    s.add(Job("a", list(prompt), SamplingParams(), 5))
    plan = s.schedule()
    while not plan.saves:
        s.update(plan, result(plan))
        plan = s.schedule()
    assert [sv.tokens for sv in plan.saves] == [tuple(prompt)]
    assert s.jobs["a"].status == JobStatus.DECODING  # saved while it runs: a crash now loses no prefill
    plans = run_to_end(s)
    # the turn's end adds only a few tokens: the prompt's entry already covers it
    assert not any(p.saves for p in plans)


def test_a_store_false_job_never_reaches_the_disk_tier():
    """Not at its turn's end, not as a long prompt, not when its slot is evicted for another
    job: its tokens would outlive a restart there. A stored job beside it is saved as ever."""
    s = sched(lanes=1, slots=1, n_ctx=2048)
    a = toks(31, 600)  # long enough for the prompt save
    s.add(Job("a", list(a), SamplingParams(), 3, persist=False))
    plans = run_to_end(s)
    assert not any(p.saves for p in plans)
    b = toks(32, 150)
    s.add(Job("b", list(b), SamplingParams(), 2))  # evicts a's slot
    plans = run_to_end(s)
    assert [sv.tokens[:150] for p in plans for sv in p.saves] == [tuple(b)]  # b's turn end only
    assert len(s.tiers.disk) == 1
