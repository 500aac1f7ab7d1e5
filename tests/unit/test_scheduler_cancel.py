"""The pure scheduler: finishing and cancelling jobs, and reset when a worker dies."""

from superfluid.request import FinishReason, SamplingParams
from superfluid.sched.scheduler import Job, JobStatus

from .test_scheduler import EOG, sched, job, result, step

# -- finish / cancel ------------------------------------------------------------------------


def test_cancel_a_waiting_job_removes_it_from_the_queue():
    s = sched(lanes=1)
    a, b = job("a"), job("b")
    s.add(a)
    s.add(b)
    assert s.finish("b", FinishReason.CANCELLED) is True
    assert (b.status, b.finish) == (JobStatus.FINISHED, FinishReason.CANCELLED)
    assert len(s.waiting) == 1
    plan = s.schedule()
    assert [j.id for j in s.running.values()] == ["a"] and len(plan.opens) == 1
    assert plan.closes == ()


def test_finish_unknown_job_returns_false():
    s = sched()
    assert s.finish("nope", FinishReason.CANCELLED) is False


def test_finish_after_the_job_ended_returns_false_and_keeps_the_reason():
    s = sched()
    a = job("a")
    s.add(a)
    step(s, default=EOG)
    assert s.finish("a", FinishReason.CANCELLED) is False
    assert a.finish == FinishReason.END_OF_TURN


def test_cancel_a_running_job_frees_its_lane_at_the_next_step():
    s = sched(lanes=1)
    s.add(job("a"))
    s.add(Job("b", [50, 51, 52], SamplingParams(), 10))
    step(s)
    assert s.finish("a", FinishReason.CANCELLED)
    assert not s.running and s.has_work
    plan = s.schedule()
    assert plan.closes == (0,)
    assert [o.seq for o in plan.opens] == [0]
    assert [r.seq for r in plan.runs] == [0] and plan.runs[0].pos == 0  # b, from scratch
    assert s.running[0].id == "b"


def test_tokens_sampled_for_a_job_finished_during_the_step_are_dropped():
    s = sched(lanes=2)
    a, b = job("a"), job("b")
    s.add(a)
    s.add(b)
    plan = s.schedule()
    s.finish("a", FinishReason.STOP_SEQUENCE)  # while the worker runs the step
    ev = s.update(plan, result(plan, {0: 5, 1: 6}))
    assert [(e.job_id, e.token) for e in ev] == [("b", 6)]
    assert a.output == [] and a.finish == FinishReason.STOP_SEQUENCE
    plan = s.schedule()
    assert plan.closes == (0,)
    assert [r.seq for r in plan.runs] == [1]


def test_has_work_tracks_waiting_running_and_pending_closes():
    s = sched()
    assert not s.has_work
    s.add(job("a", max_tokens=1))
    assert s.has_work
    step(s)
    assert s.has_work  # the close is still to be sent
    plan = s.schedule()
    assert plan.closes == (0,)
    assert not s.has_work


def test_reset_returns_running_jobs_and_keeps_waiting_ones():
    s = sched(lanes=1)
    a, b = job("a"), job("b")
    s.add(a)
    s.add(b)
    step(s)
    lost = s.reset()
    assert lost == [a]
    assert (a.status, a.finish) == (JobStatus.FINISHED, FinishReason.ERROR)
    assert "a" not in s.jobs and not s.running
    assert [j.id for j in s.waiting] == ["b"]
    plan = s.schedule()
    assert plan.closes == ()  # the old worker's lanes are gone, nothing to close
    assert [o.seq for o in plan.opens] == [0] and s.running[0] is b


def test_reset_with_requeue_resumes_running_jobs_from_what_they_generated():
    s = sched(lanes=2)
    a, b, c = job("a"), job("b"), job("c")
    s.add(a)
    s.add(b)
    step(s, default=7)  # both prefill and sample 7
    step(s, default=8)  # both decode and sample 8
    s.add(c)  # waiting: no lane
    assert sorted(j.id for j in s.reset(requeue=True)) == ["a", "b"]
    assert a.status == JobStatus.WAITING and b.status == JobStatus.WAITING and not s.running
    assert "a" in s.jobs and "b" in s.jobs
    plan = s.schedule()
    assert sorted(j.id for j in s.running.values()) == ["a", "b"]  # back at the front: ahead of c
    assert plan.closes == ()
    assert {o.seq: o.history for o in plan.opens} == {0: (7, 8), 1: (7, 8)}
    assert sorted((r.pos, r.tokens[-2:]) for r in plan.runs) == [(0, (7, 8)), (0, (7, 8))]
    assert a.output == [7, 8] and b.output == [7, 8]  # nothing generated is lost or repeated


def test_reset_forgets_pending_closes():
    s = sched(lanes=1)
    s.add(job("a"))
    step(s)
    s.finish("a", FinishReason.CANCELLED)
    assert s.reset() == []
    assert s.schedule() is None  # nothing to close, nothing to run
    assert not s.has_work



def test_reset_with_retry_requeues_jobs_that_produced_nothing_once():
    """A worker that died before a job's first token (killed while idle, not yet noticed):
    the job is retried on the next worker, once; a job with output ends with the error."""
    s = sched(lanes=2)
    a = job("a")
    s.add(a)
    step(s, default=7)  # a has output
    b = job("b")
    s.add(b)
    s.schedule()  # b admitted and prefilling: nothing received yet
    assert [j.id for j in s.reset(retry=True)] == ["a"]
    assert "a" not in s.jobs and b.status == JobStatus.WAITING and b.retried
    s.schedule()
    assert [j.id for j in s.running.values()] == ["b"]
    assert [j.id for j in s.reset(retry=True)] == ["b"]  # its second worker death: it fails
    assert not s.jobs and not s.has_work
