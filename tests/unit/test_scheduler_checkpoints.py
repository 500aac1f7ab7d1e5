"""Seating on a model whose prefix cache is state checkpoints (a recurrent or hybrid model,
runtime/checkpoints.py): the scheduler marks where the runtime saves a lane's state (the end of
every run of more than one token, the last plan.CHECKPOINTS), seats a job only at one of those
or at a free lane's end, and a lane the runtime could only cut back further is seated again
from what it still holds (StepResult.held)."""

from superfluid.plan import CHECKPOINTS, Sampled, StepResult
from superfluid.request import SamplingParams
from superfluid.sched.scheduler import Job, Scheduler

EOG = 0


def sched(lanes: int = 2, step_tokens: int = 16) -> Scheduler:
    s = Scheduler(lanes=lanes, n_ctx=512, step_tokens=step_tokens, eog=frozenset({EOG}))
    s.slots.checkpoints = True
    s.prefill_budget = step_tokens
    return s


def job(jid: str, prompt: list[int], max_tokens: int = 2) -> Job:
    return Job(jid, prompt, SamplingParams(), max_tokens)


def run_to_end(s: Scheduler, jid: str) -> None:
    while jid in s.jobs and s.jobs[jid].status.name != "FINISHED":
        plan = s.schedule()
        assert plan is not None
        s.update(plan, StepResult(plan.step, tuple(Sampled(r.seq, 7) for r in plan.runs if r.sample)))
    s.schedule()  # retires the lane


PROMPT = list(range(100, 150))  # 50 tokens: prefilled in runs of 16, 16, 16, 2


def test_prefill_runs_mark_where_the_runtime_checkpoints():
    s = sched()
    s.add(job("a", PROMPT))
    run_to_end(s, "a")
    slot = s.slots[0]
    assert slot.marks == [16, 32, 48, 50]  # each prefill run's end; decodes (one token) mark nothing
    assert len(slot.kv) == 51  # the prompt and the first sampled token fed back


def test_a_job_is_seated_at_the_deepest_checkpoint_or_a_free_lanes_end():
    s = sched()
    s.add(job("a", PROMPT))
    run_to_end(s, "a")
    s.add(job("b", PROMPT[:40] + [1, 2, 3]))  # shares 40: the deepest checkpoint below is 32
    plan = s.schedule()
    (o,) = plan.opens
    assert o.keep == 32 and s.jobs["b"].cached == 32
    s.update(plan, StepResult(plan.step, tuple(Sampled(r.seq, 7) for r in plan.runs if r.sample)))
    run_to_end(s, "b")
    s.add(job("c", s.slots[o.seq].kv + [9, 9]))  # extends the whole lane: its end is a cut
    plan = s.schedule()
    assert plan.opens[0].keep == len(s.jobs["c"].prompt) - 2


def test_a_repeated_prompt_keeps_a_checkpoint_below_its_last_token():
    s = sched()
    s.add(job("a", PROMPT))
    run_to_end(s, "a")
    s.add(job("b", PROMPT))  # its last token is fed again: 49 at most, so the checkpoint at 48
    assert s.schedule().opens[0].keep == 48


def test_a_kv_cache_is_cut_anywhere():
    s = sched()
    s.slots.checkpoints = False
    s.add(job("a", PROMPT))
    run_to_end(s, "a")
    assert s.slots[0].marks == []
    s.add(job("b", PROMPT[:40] + [1, 2, 3]))
    assert s.schedule().opens[0].keep == 40


def test_only_the_last_checkpoints_are_kept():
    s = sched(step_tokens=4)
    s.add(job("a", list(range(100, 150))))
    run_to_end(s, "a")
    assert len(s.slots[0].marks) == CHECKPOINTS and s.slots[0].marks[-1] == 50


def test_a_lane_cut_back_further_is_seated_again_from_what_it_holds():
    s = sched()
    s.add(job("a", PROMPT))
    run_to_end(s, "a")
    s.add(job("b", PROMPT[:40] + [1, 2, 3]))
    plan = s.schedule()
    seq = plan.opens[0].seq
    # the runtime had no checkpoint at 32 after all: the lane holds 16
    s.update(plan, StepResult(plan.step, (), failed=(seq,), held=((seq, 16),)))
    assert s.slots[seq].kv == PROMPT[:16] and s.slots[seq].marks == [16]
    plan = s.schedule()
    (o,) = plan.opens
    assert (o.seq, o.keep) == (seq, 16)
    assert [(r.pos, len(r.tokens)) for r in plan.runs] == [(16, 16)]


def test_a_copy_takes_its_sources_checkpoints_up_to_the_cut():
    s = sched(lanes=2)
    s.add(job("a", PROMPT, max_tokens=50))
    for _ in range(5):  # a's prompt prefilled, decoding: its slot is running
        plan = s.schedule()
        s.update(plan, StepResult(plan.step, tuple(Sampled(r.seq, 7) for r in plan.runs if r.sample)))
    s.add(job("b", PROMPT[:40] + [1, 2, 3]))
    plan = s.schedule()
    (c,) = plan.copies
    assert c.n == 32
    assert s.slots[c.dst].marks == [16, 32, 43]  # and its own prefill run from there
