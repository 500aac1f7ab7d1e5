"""Multi-step decode in the pure scheduler and the step budget (sched/multistep.py,
engine/budget.py): which plans may run several decode forwards, how many, and how the
tokens they return are folded in."""

from types import SimpleNamespace

from superfluid.engine.budget import DECODE_PLAN_S, StepBudget
from superfluid.plan import Run, Sampled, StepResult
from superfluid.request import FinishReason, Qos, SamplingParams
from superfluid.sched import multistep
from superfluid.sched.scheduler import Job, JobStatus, Scheduler

EOG = 0


def sched(steps: int = 4, n_ctx: int = 64, lanes: int = 2) -> Scheduler:
    s = Scheduler(lanes=lanes, n_ctx=n_ctx, step_tokens=64, eog=frozenset({EOG}))
    s.decode_steps = steps
    return s


def job(jid: str, n: int = 3, max_tokens: int = 20, qos: Qos = Qos.AGENT) -> Job:
    return Job(jid, list(range(100, 100 + n)), SamplingParams(temperature=0), max_tokens, qos)


def decoding(s: Scheduler, *jobs: Job) -> None:
    """Admit and prefill the jobs, fold in a first token each: they decode from the next plan."""
    for j in jobs:
        s.add(j)
    plan = s.schedule()
    s.update(plan, StepResult(plan.step, tuple(Sampled(j.seq, 7) for j in jobs)))


def test_decodes_alone_get_more_forwards_within_max_tokens_and_what_is_in_flight():
    s = sched(steps=4)
    a, b = job("a", max_tokens=9), job("b", max_tokens=3)
    decoding(s, a, b)
    first = s.schedule()
    assert {r.seq: r.more for r in first.runs} == {a.seq: 3, b.seq: 1}  # b: 1 generated, this run's, 1 more
    second = s.schedule()  # a: 1 + (1 + 3) in flight, this run's own: 9 - 6 = 3 more at most
    # (b's run, planned before its tokens are back, gets none: its request may end with them)
    assert {r.seq: r.more for r in second.runs} == {a.seq: 3, b.seq: 0}
    third = s.schedule()  # a: 1 + 4 + 4 + this one = 10 > 9: none more
    assert {r.seq: r.more for r in third.runs if r.seq == a.seq} == {a.seq: 0}


def test_no_more_forwards_beside_a_prefill_or_a_waiting_job_and_drafts_share_the_room():
    s = sched(steps=4, lanes=1)
    a = job("a")
    decoding(s, a)
    s.add(job("b"))  # waits: the lane is taken
    assert [r.more for r in s.schedule().runs] == [0]
    s.finish("b", FinishReason.CANCELLED)
    assert [r.more for r in s.schedule().runs] == [3]
    s2 = sched(steps=4)
    decoding(s2, job("c"))
    s2.add(job("d", n=20))  # admitted: its prompt prefills in this plan
    plan = s2.schedule()
    assert len(plan.runs) == 2 and all(r.more == 0 for r in plan.runs)
    s3 = sched(steps=4)
    s3.spec.max_tokens = 4  # speculation: more forwards where the drafter proposes none, in the same room
    decoding(s3, job("e", max_tokens=12))
    (run,) = s3.schedule().runs
    assert run.draft == 4 and run.more == 3  # 1 generated, this run's token: 10 more, 4 + 3 of them here
    (run,) = s3.schedule().runs  # 2 planned, 7 in flight: 12 - 9 = 3 left, drafts first
    assert run.draft == 2 and run.more == 0


def test_not_where_the_runtime_cannot_place_decodes_or_rows_must_be_deterministic():
    s = sched(steps=4)
    s.spec.supported = False
    decoding(s, job("a"))
    assert [r.more for r in s.schedule().runs] == [0]
    d = Scheduler(lanes=2, n_ctx=64, step_tokens=64, eog=frozenset({EOG}), tail_rows=2)
    d.decode_steps = 4
    decoding(d, job("b"))
    assert all(r.more == 0 for r in d.schedule().runs)


def test_a_plans_several_tokens_are_folded_in_and_a_token_that_ends_the_job_drops_the_rest():
    s = sched(steps=4)
    a, b = job("a", max_tokens=20), job("b", max_tokens=20)
    decoding(s, a, b)
    plan = s.schedule()
    before = s.counters.decode_tokens
    events = s.update(plan, StepResult(plan.step, (
        Sampled(a.seq, 11), Sampled(b.seq, 21), Sampled(a.seq, 12), Sampled(b.seq, EOG),
        Sampled(a.seq, 13), Sampled(a.seq, 14))))
    assert a.output == [7, 11, 12, 13, 14] and a.pending == 0 and a.scheduled == len(a.prompt) + 4
    assert b.output == [7, 21, EOG] and b.status == JobStatus.FINISHED and b.finish == FinishReason.END_OF_TURN
    assert [e.token for e in events if e.job_id == "a"] == [11, 12, 13, 14]
    assert s.counters.decode_tokens - before == 4  # two planned, one more of each lane
    (run,) = s.schedule().runs  # a goes on from its last token; b's lane is closed
    assert run.seq == a.seq and run.more == 3


def test_forwards_counts_the_forwards_of_a_plan_of_decodes_that_verified_no_drafts():
    runs = (Run(0, 5, (1,), True, 0, 3), Run(1, 9, (1,), True, 4, 3))
    assert multistep.forwards(runs, [0, 1, 0, 1, 0], drafted=False) == 3
    assert multistep.forwards(runs, [0, 1, 1, 1], drafted=True) == 0  # tokens of drafts, not of forwards
    assert multistep.forwards((Run(0, 0, (1, 2, 3), True),), [0], drafted=False) == 0  # a prefill


def test_the_budget_sizes_plans_of_decodes_from_the_measured_forward():
    s = SimpleNamespace(running={}, waiting=SimpleNamespace(count=lambda q: 0), decode_steps=1,
                        embeds=SimpleNamespace(has_work=False))
    b = StepBudget(step_target_s=0.25, step_tokens=512, lanes=8, decode_steps=4)
    b.after_step(s, 1, DECODE_PLAN_S / 2.2, 0.0, forwards=1)  # about two forwards fit the time
    assert s.decode_steps == 2
    for _ in range(30):  # fast forwards: the cap
        b.after_step(s, 1, 4 * DECODE_PLAN_S / 100, 0.0, forwards=4)
    assert s.decode_steps == 4
    for _ in range(30):  # slow ones (many lanes): one a plan
        b.after_step(s, 8, 3 * DECODE_PLAN_S, 0.0, forwards=1)
    assert s.decode_steps == 1
    off = StepBudget(step_target_s=0.25, step_tokens=512, lanes=8, decode_steps=1)
    s.decode_steps = 1
    off.after_step(s, 1, 0.001, 0.0, forwards=1)
    assert s.decode_steps == 1
