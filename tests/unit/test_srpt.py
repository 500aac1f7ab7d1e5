"""Shortest remaining work first within a class (sched/srpt.py), in the pure scheduler with
hand-made step results (no model)."""

from superfluid.plan import Sampled, StepPlan, StepResult
from superfluid.request import FinishReason, Qos, SamplingParams
from superfluid.sched import srpt
from superfluid.sched.scheduler import Job, JobStatus, Scheduler

EOG = 0


def sched(lanes=2, slots=None, step_tokens=64, budget=64, srpt_on=True, **kw) -> Scheduler:
    s = Scheduler(lanes=lanes, n_ctx=4096, step_tokens=step_tokens, eog=frozenset({EOG}), slots=slots,
                  srpt=srpt_on, **kw)
    s.prefill_budget = budget
    return s


def job(jid, n, max_tokens=50, qos=Qos.AGENT, base=1000) -> Job:
    return Job(jid, list(range(base, base + n)), SamplingParams(temperature=0), max_tokens, qos)


def result(plan: StepPlan, token=7) -> StepResult:
    return StepResult(plan.step, tuple(Sampled(r.seq, token) for r in plan.runs if r.sample))


def run(s: Scheduler, steps=1, token=7):
    events = []
    for _ in range(steps):
        plan = s.schedule()
        if plan is None:
            break
        events += s.update(plan, result(plan, token))
    return events


def seq_of(s: Scheduler, jid: str) -> int:
    return next(q for q, j in s.running.items() if j.id == jid)


def running_ids(s: Scheduler) -> list[str]:
    return sorted(j.id for j in s.running.values())


def test_remaining_work_counts_prefill_left_and_a_bounded_decode():
    j = job("a", 300, max_tokens=10_000)
    assert srpt.work(j) == 300 + srpt.DECODE_HORIZON  # max_tokens is often the rest of the window
    j.warm = 280  # a slot held most of it when it was queued
    assert srpt.prefill_left(j) == 20 and srpt.short(j, 16)
    j.cached, j.scheduled, j.output = 280, 700, [5] * 400  # admitted, prefilled, generated 400
    assert srpt.prefill_left(j) == 0 and srpt.decode_left(j) == srpt.DECODE_HORIZON + 400
    assert srpt.work(job("b", 10, max_tokens=16)) == 26


def test_a_short_newcomer_takes_the_lane_of_the_same_class_job_with_the_most_work():
    s = sched(lanes=3, slots=6)
    s.add(job("doc_a", 400, base=1000))
    s.add(job("doc_b", 900, base=2000))
    s.add(job("doc_c", 600, base=5000))
    run(s, 1)
    b_seq = seq_of(s, "doc_b")
    s.add(job("chat", 20, max_tokens=16, base=9000))
    plan = s.schedule()
    assert b_seq in plan.closes
    assert running_ids(s) == ["chat", "doc_a", "doc_c"]
    assert s.jobs["doc_b"].status == JobStatus.WAITING
    assert s.counters.preemptions == 1 and s.counters.short_preemptions == 1
    # the chat's prompt goes first in the step, whole
    first = plan.runs[0]
    assert first.seq == seq_of(s, "chat") and len(first.tokens) == 20 and first.sample


def test_without_srpt_the_same_class_newcomer_waits():
    s = sched(lanes=3, slots=6, srpt_on=False)
    for i, n in enumerate((400, 900, 600)):
        s.add(job(f"doc{i}", n, base=1000 * (i + 1)))
    run(s, 1)
    s.add(job("chat", 20, max_tokens=16, base=9000))
    plan = s.schedule()
    assert plan.closes == () and "chat" not in running_ids(s) and s.counters.preemptions == 0


def test_no_preemption_without_a_spare_kv_slot():
    s = sched(lanes=2, slots=2)  # the victim's KV would be evicted by the newcomer at once
    s.add(job("doc_a", 900, base=1000))
    s.add(job("doc_b", 900, base=2000))
    run(s, 1)
    s.add(job("chat", 20, max_tokens=16, base=9000))
    plan = s.schedule()
    assert plan.closes == () and running_ids(s) == ["doc_a", "doc_b"] and s.counters.preemptions == 0


def test_a_long_newcomer_does_not_preempt():
    s = sched(lanes=2, slots=4, budget=64)
    s.add(job("doc_a", 900, base=1000))
    s.add(job("doc_b", 900, base=2000))
    run(s, 1)
    s.add(job("long", srpt.SHORT_MIN + 1, max_tokens=1, base=5000))  # more than one step, and > SHORT_MIN
    plan = s.schedule()
    assert plan.closes == () and running_ids(s) == ["doc_a", "doc_b"] and s.counters.preemptions == 0


def test_no_preemption_of_jobs_with_less_work_than_the_newcomer():
    s = sched(lanes=2, slots=4)
    s.add(job("a", 10, max_tokens=5, base=1000))
    s.add(job("b", 10, max_tokens=5, base=2000))
    run(s, 1)  # both decode, 4 tokens left each
    s.add(job("chat", 20, max_tokens=16, base=9000))
    plan = s.schedule()
    assert plan.closes == () and running_ids(s) == ["a", "b"]


def test_a_better_class_is_never_taken_by_a_short_job():
    s = sched(lanes=1, slots=2)
    s.add(job("chat", 900, max_tokens=500, qos=Qos.INTERACTIVE))
    run(s, 1)
    s.add(job("short_agent", 10, max_tokens=4, base=5000))
    plan = s.schedule()
    assert plan.closes == () and running_ids(s) == ["chat"]


def test_a_short_agent_job_takes_a_lane_from_a_long_background_job():
    s = sched(lanes=2, slots=4)
    s.add(job("ag", 900, base=1000))
    s.add(job("bg", 300, qos=Qos.BACKGROUND, base=2000))
    run(s, 1)
    s.add(job("chat", 20, max_tokens=16, base=9000))
    s.schedule()
    assert running_ids(s) == ["ag", "chat"]  # the lowest class goes first, though ag has more work


def test_prefill_goes_shortest_remaining_first_within_a_class():
    s = sched(lanes=3, step_tokens=64, budget=48)
    s.add(job("long", 200, base=1000))
    s.add(job("mid", 60, base=2000))
    s.add(job("short", 30, base=3000))
    plan = s.schedule()
    got = {s.running[r.seq].id: len(r.tokens) for r in plan.runs}
    assert got == {"short": 30, "mid": 18}  # short whole, the rest of the budget to mid, none to long
    s.update(plan, result(plan))
    plan = s.schedule()  # short decodes (1 token); mid (42 left) before long (200 left)
    got = {s.running[r.seq].id: len(r.tokens) for r in plan.runs}
    assert got == {"short": 1, "mid": 42, "long": 5}


def test_better_class_still_prefills_first():
    s = sched(lanes=2, budget=48)
    s.add(job("ag", 10, base=1000))
    s.add(job("chat", 100, qos=Qos.COMPLETION, base=2000))
    plan = s.schedule()
    assert [s.running[r.seq].id for r in plan.runs] == ["chat"]


def test_the_preempted_job_resumes_from_its_kv_and_continues_exactly():
    s = sched(lanes=1, slots=2)
    s.add(job("doc", 40, max_tokens=300, base=1000))
    p1 = s.schedule()
    s.update(p1, result(p1, 11))
    p2 = s.schedule()  # doc decodes 11; its token is in flight
    s.add(job("chat", 8, max_tokens=1, base=9000))
    p3 = s.schedule()  # the chat takes doc's lane while p2 runs
    doc = s.jobs["doc"]
    assert doc.status == JobStatus.WAITING and doc.output == [11] and p1.opens[0].seq in p3.closes
    assert s.update(p2, result(p2, 12)) == []  # doc's in-flight token is dropped, recomputed later
    evs = s.update(p3, result(p3, 13))
    assert [(e.job_id, e.finish) for e in evs] == [("chat", FinishReason.LENGTH)]
    p4 = s.schedule()  # doc is back in its own slot: 40 prompt tokens kept, its last token fed again
    op = p4.opens[0]
    assert op.seq == p1.opens[0].seq and op.keep == 40 and op.history == (11,)
    assert [(r.pos, r.tokens, r.sample) for r in p4.runs] == [(40, (11,), True)]
    s.update(p4, result(p4, 12))
    assert doc.output == [11, 12]


def test_a_taken_job_is_not_taken_again_before_it_moved_on():
    s = sched(lanes=1, slots=3)
    s.add(job("doc", 40, max_tokens=300, base=1000))
    run(s, 2)  # doc decodes
    s.add(job("c1", 8, max_tokens=1, base=8000))
    run(s, 1)  # c1 takes the lane and ends
    assert s.counters.short_preemptions == 1
    p = s.schedule()  # doc is back; its result is not in yet
    assert running_ids(s) == ["doc"]
    s.add(job("c2", 8, max_tokens=1, base=9000))
    p2 = s.schedule()  # doc has not moved past where c1 took it: c2 waits
    assert running_ids(s) == ["doc"] and s.counters.short_preemptions == 1
    s.update(p, result(p))
    s.update(p2, result(p2))
    s.schedule()  # doc moved on: now c2 may take the lane
    assert running_ids(s) == ["c2"] and s.counters.short_preemptions == 2


def finish_step(s: Scheduler, jid: str, limit: int, stream: bool) -> int | None:
    """Run until job `jid` ends; with `stream`, a short job arrives at every step."""
    for i in range(limit):
        if stream:
            s.add(job(f"s{i}", 6, max_tokens=2, base=100_000 + 10 * i))
        plan = s.schedule()
        if plan is None:
            continue
        if any(e.job_id == jid and e.finish for e in s.update(plan, result(plan))):
            return i
    return None


def test_a_stream_of_short_jobs_does_not_starve_a_long_one():
    aging = 8
    s = sched(lanes=1, slots=4, budget=16, aging_steps=aging)
    long = job("long", 200, max_tokens=4)
    s.add(long)
    done = finish_step(s, "long", 400, stream=True)
    # its own work is 13 prefill steps and 4 decodes; shorter jobs pass it until it has been
    # held back aging steps, and it waits at most about aging steps more for its class to rise
    assert done is not None and done <= 13 + 4 + 3 * aging, done
    assert s.counters.short_preemptions >= 1 and long.delayed >= aging
