"""QoS classes, lane caps, preemption, prefix reuse and burst coalescing in the pure
scheduler, driven with hand-made step results (no model)."""

from superfluid.plan import PLACEHOLDER, Copy, Sampled, StepPlan, StepResult
from superfluid.request import FinishReason, Qos, SamplingParams
from superfluid.sched.scheduler import COALESCE_MIN, Job, JobStatus, Scheduler

EOG = 0


def sched(lanes=2, slots=None, step_tokens=64, n_ctx=4096, **kw) -> Scheduler:
    return Scheduler(lanes=lanes, n_ctx=n_ctx, step_tokens=step_tokens, eog=frozenset({EOG}),
                     slots=slots, **kw)


def job(jid, prompt, qos=Qos.AGENT, max_tokens=50) -> Job:
    return Job(jid, list(prompt), SamplingParams(temperature=0), max_tokens, qos)


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


def test_better_class_is_admitted_first():
    s = sched(lanes=1)
    s.add(job("bg", range(100, 104), Qos.BACKGROUND))
    s.add(job("chat", range(200, 204), Qos.INTERACTIVE))
    plan = s.schedule()
    assert s.running[plan.opens[0].seq].id == "chat"


def test_class_lane_cap():
    s = sched(lanes=3, class_lanes={Qos.BACKGROUND: 1})
    for i in range(3):
        s.add(job(f"bg{i}", range(100 * (i + 1), 100 * (i + 1) + 4), Qos.BACKGROUND))
    s.add(job("ag", range(900, 904)))
    s.schedule()
    assert sorted(j.id for j in s.running.values()) == ["ag", "bg0"]


def test_aging_lets_background_through():
    s = sched(lanes=1, aging_steps=2)
    s.add(job("bg", range(100, 104), Qos.BACKGROUND))
    s.add(job("ag0", range(200, 204), Qos.AGENT, max_tokens=1))
    run(s, 2)  # ag0 runs and finishes; bg has waited 2 steps: it now competes as an agent job
    s.add(job("ag1", range(300, 304), Qos.AGENT))
    run(s, 1)
    assert [j.id for j in s.running.values()] == ["bg"]


def test_interactive_preempts_the_youngest_decoding_lane_of_the_lowest_class():
    s = sched(lanes=3, slots=6)
    s.add(job("ag", range(100, 104), Qos.AGENT))
    s.add(job("bg_old", range(200, 204), Qos.BACKGROUND))
    s.add(job("bg_young", range(300, 304), Qos.BACKGROUND))
    run(s, 3)
    young_seq = next(q for q, j in s.running.items() if j.id == "bg_young")
    s.add(job("chat", range(400, 404), Qos.INTERACTIVE))
    plan = s.schedule()
    assert young_seq in plan.closes
    assert s.jobs["bg_young"].status == JobStatus.WAITING
    assert sorted(j.id for j in s.running.values()) == ["ag", "bg_old", "chat"]
    assert s.counters.preemptions == 1
    # the victim is first in line once a lane frees (ahead of a background job queued before)
    order = [j.id for j in s.waiting.ordered(plan.step)]
    assert order[0] == "bg_young"


def test_agent_jobs_do_not_preempt():
    s = sched(lanes=1)
    s.add(job("bg", range(100, 104), Qos.BACKGROUND))
    run(s, 1)
    s.add(job("ag", range(200, 204), Qos.AGENT))
    plan = s.schedule()
    assert plan.closes == () and [j.id for j in s.running.values()] == ["bg"]


def test_no_preemption_of_an_equal_class():
    s = sched(lanes=1)
    s.add(job("c1", range(100, 104), Qos.INTERACTIVE))
    run(s, 1)
    s.add(job("c2", range(200, 204), Qos.INTERACTIVE))
    s.schedule()
    assert [j.id for j in s.running.values()] == ["c1"]


def test_preempted_job_resumes_from_its_own_kv_and_drops_tokens_in_flight():
    s = sched(lanes=1, slots=2)
    s.add(job("bg", range(100, 110), Qos.BACKGROUND))
    p1 = s.schedule()
    s.update(p1, result(p1, 11))
    p2 = s.schedule()  # bg decodes 11 -> in flight
    s.add(job("chat", range(500, 504), Qos.INTERACTIVE, max_tokens=1))
    p3 = s.schedule()  # chat preempts bg while p2 is in flight
    bg = s.jobs["bg"]
    assert bg.status == JobStatus.WAITING and bg.output == [11]
    assert s.update(p2, result(p2, 12)) == []  # bg's in-flight token is dropped
    evs = s.update(p3, result(p3, 13))
    assert [(e.job_id, e.finish) for e in evs] == [("chat", FinishReason.LENGTH)]
    p4 = s.schedule()  # bg back: its old slot kept its KV, reused in place
    op = p4.opens[0]
    assert op.seq == p1.opens[0].seq and op.keep == 10 and op.history == (11,)
    assert [(r.pos, r.tokens, r.sample) for r in p4.runs] == [(10, (11,), True)]
    evs = s.update(p4, result(p4, 12))
    assert [e.token for e in evs] == [12] and bg.output == [11, 12]


def test_prefix_reuse_in_place_and_by_copy():
    s = sched(lanes=2, slots=3)
    base = list(range(100, 140))
    s.add(job("a", base + [1], max_tokens=1))
    run(s, 1)  # a finishes; its slot keeps base + [1]
    s.add(job("b", base + [2], max_tokens=20))
    plan = s.schedule()
    assert plan.opens[0].keep == 40 and plan.copies == ()  # in place: 40 tokens warm
    assert plan.runs[0].pos == 40 and plan.runs[0].tokens == (2,)
    s.update(plan, result(plan))
    s.add(job("c", base + [3], max_tokens=20))
    s.jobs["b"]  # b is running: c copies from it into another slot
    plan = s.schedule()
    b_seq = next(q for q, j in s.running.items() if j.id == "b")
    c_seq = next(q for q, j in s.running.items() if j.id == "c")
    assert plan.copies == (Copy(b_seq, c_seq, 40),) or plan.opens[0].keep == 40
    assert s.counters.cached_tokens >= 80


def test_short_shared_prefix_is_recomputed_not_copied():
    s = sched(lanes=2, slots=2)
    s.add(job("a", [1, 2, 3, 4, 5, 6], max_tokens=30))
    run(s, 1)
    s.add(job("b", [1, 2, 3, 9]))
    plan = s.schedule()
    assert plan.copies == () and plan.opens[0].keep == 0
    assert s.counters.cold_admissions == 2


def test_burst_with_a_shared_long_prefix_prefills_it_once():
    s = sched(lanes=4, slots=4, step_tokens=64)
    shared = list(range(1000, 1000 + 4 * COALESCE_MIN))
    for i in range(4):
        s.add(job(f"q{i}", shared + [i, i], max_tokens=2))
    events = run(s, 40)
    assert sorted({e.job_id for e in events if e.finish}) == ["q0", "q1", "q2", "q3"]
    # the shared part went to the worker once; the others copied it
    assert s.counters.prefill_tokens < len(shared) + 4 * 3 + 1
    assert s.counters.cached_tokens == 3 * len(shared)


def test_interactive_prefill_goes_alone():
    s = sched(lanes=2, step_tokens=32)
    s.add(job("bg", range(100, 300), Qos.BACKGROUND))
    run(s, 1)
    s.add(job("chat", range(500, 540), Qos.INTERACTIVE))
    plan = s.schedule()
    seqs = {r.seq: s.running[r.seq].id for r in plan.runs}
    assert set(seqs.values()) == {"chat"}


def test_prefill_budget_is_respected_and_decodes_come_first():
    s = sched(lanes=2, step_tokens=64)
    s.prefill_budget = 16
    s.add(job("a", range(100, 104)))
    run(s, 1)
    s.add(job("b", range(200, 300)))
    plan = s.schedule()
    assert plan.runs[0].tokens == (PLACEHOLDER,) or len(plan.runs[0].tokens) == 1
    assert sum(len(r.tokens) for r in plan.runs) <= 16
