"""Embedding jobs in the pure scheduler: packed into the prefill budget by class, big inputs
alone, results mapped back to their inputs, cancel and worker loss."""

import pytest

from superfluid.plan import Sampled, StepPlan, StepResult, Vector
from superfluid.request import Qos, SamplingParams
from superfluid.sched.embeds import EmbedEvent, EmbedJob
from superfluid.sched.jobs import TokenEvent
from superfluid.sched.scheduler import Job, Scheduler


def sched(lanes: int = 2, step_tokens: int = 64, budget: int = 16, window: int = 48) -> Scheduler:
    s = Scheduler(lanes=lanes, n_ctx=256, step_tokens=step_tokens, eog=frozenset({0}), embed_window=window)
    s.prefill_budget = s.embed_budget = budget
    return s


def ejob(jid: str, sizes: list[int], qos: Qos = Qos.EMBEDDING) -> EmbedJob:
    return EmbedJob(jid, [(tuple(range(10, 10 + n)), 0) for n in sizes], qos)


def gjob(jid: str, n: int, qos: Qos = Qos.AGENT) -> Job:
    return Job(jid, list(range(100, 100 + n)), SamplingParams(), 50, qos)


def answer(plan: StepPlan, token: int = 7) -> StepResult:
    """A sampled token per sampling run and a vector per embed item (its key as the value)."""
    return StepResult(plan.step, tuple(Sampled(r.seq, token) for r in plan.runs if r.sample), 0.0,
                      tuple(Vector(e.key, bytes([e.key % 256]) * 4) for e in plan.embeds))


def embeds_of(plan: StepPlan | None) -> list[int]:
    return [len(e.tokens) for e in plan.embeds] if plan is not None else []


def test_inputs_are_packed_into_the_budget_and_every_result_finds_its_input():
    s = sched(budget=16)
    s.add_embed(ejob("e", [5, 5, 5, 5, 3]))
    p1 = s.schedule()
    assert embeds_of(p1) == [5, 5, 5] and p1.runs == () and p1.opens == ()
    ev1 = s.update(p1, answer(p1))
    p2 = s.schedule()
    assert embeds_of(p2) == [5, 3]
    ev2 = s.update(p2, answer(p2))
    events = [e for e in ev1 + ev2 if isinstance(e, EmbedEvent)]
    assert [e.index for e in events] == [0, 1, 2, 3, 4] and all(e.job_id == "e" for e in events)
    assert not s.has_work and s.schedule() is None
    assert s.counters.embed_tokens == 23


def test_an_input_over_the_budget_goes_alone_in_a_step_of_its_own():
    s = sched(budget=16)
    s.add_embed(ejob("e", [4, 40, 4]))
    assert embeds_of(s.schedule()) == [4]  # the big one waits: this step has an input already
    assert embeds_of(s.schedule()) == [40]  # alone
    assert embeds_of(s.schedule()) == [4]


def test_inputs_over_the_window_are_refused():
    s = sched(window=48)
    with pytest.raises(ValueError, match="window"):
        s.add_embed(ejob("e", [49]))
    with pytest.raises(ValueError, match="empty"):
        s.add_embed(EmbedJob("f", [((), 0)]))


def test_decodes_come_first_and_an_agent_prefill_before_embedding_work():
    s = sched(budget=16)
    s.add(gjob("a", 2))
    p = s.schedule()
    s.update(p, answer(p))  # a decodes now
    s.add(gjob("b", 12))
    s.add_embed(ejob("e", [3, 3, 3]))
    p = s.schedule()
    assert [len(r.tokens) for r in p.runs] == [1, 12]  # a's decode, then b's whole prompt
    assert embeds_of(p) == [3]  # what is left of the budget: 16 - 13


def test_embedding_work_goes_before_background_prefill():
    s = sched(lanes=2, budget=10)
    s.add(gjob("bg", 20, Qos.BACKGROUND))
    s.add_embed(ejob("e", [4, 4]))
    p = s.schedule()
    assert embeds_of(p) == [4, 4]
    assert [len(r.tokens) for r in p.runs] == [2]  # background gets what is left


def test_an_interactive_prefill_runs_without_embedding_work_beside_it():
    s = sched(lanes=2, budget=16)
    s.add_embed(ejob("e", [4] * 20))
    s.add(gjob("chat", 30, Qos.INTERACTIVE))
    p = s.schedule()
    assert embeds_of(p) == [] and [len(r.tokens) for r in p.runs] == [30]  # the chat takes the step
    s.update(p, answer(p))
    p = s.schedule()
    assert len(p.runs) == 1 and embeds_of(p) == [4, 4, 4, 4]  # chat decodes; embedding goes on beside it


def test_an_interactive_embedding_job_goes_before_agent_prefill():
    s = sched(lanes=2, budget=8)
    s.add(gjob("a", 20))
    s.add_embed(ejob("q", [6], Qos.INTERACTIVE))
    p = s.schedule()
    assert embeds_of(p) == [6] and [len(r.tokens) for r in p.runs] == [2]


def test_a_cancelled_job_plans_no_more_and_its_late_results_are_dropped():
    s = sched(budget=8)
    s.add_embed(ejob("e", [4, 4, 4, 4]))
    p = s.schedule()
    assert s.finish("e", None)  # type: ignore[arg-type]
    assert s.update(p, answer(p)) == []
    assert s.schedule() is None and not s.has_work


def test_a_lost_worker_sends_unanswered_inputs_again():
    s = sched(budget=8)
    s.add_embed(ejob("e", [4, 4, 4, 4]))
    p1 = s.schedule()
    ev = s.update(p1, answer(p1))
    s.schedule()  # inputs 2 and 3 in flight when the worker dies
    s.reset()
    p3 = s.schedule()
    assert embeds_of(p3) == [4, 4]
    ev += s.update(p3, answer(p3))
    assert [e.index for e in ev] == [0, 1, 2, 3]


def test_a_failed_input_fails_its_job_only():
    s = sched(budget=16)
    s.add_embed(ejob("bad", [4, 4]))
    s.add_embed(ejob("good", [4]))
    p = s.schedule()
    keys = {e.key: i for i, e in enumerate(p.embeds)}
    vecs = tuple(Vector(k, error="boom", code="x") if i == 0 else Vector(k, b"\0" * 4) for k, i in keys.items())
    ev = s.update(p, StepResult(p.step, (), 0.0, vecs))
    assert [(e.job_id, e.error) for e in ev if isinstance(e, EmbedEvent)][0] == ("bad", "boom")
    assert "good" not in s.embeds.jobs and "bad" not in s.embeds.jobs
    assert not any(isinstance(e, TokenEvent) for e in ev)


def test_embedding_tokens_have_their_own_budget_beyond_the_lanes_batch():
    s = sched(step_tokens=16, budget=16)
    s.embed_budget = 100  # a fast embedding model: far more than the lanes' batch per step
    s.add(gjob("a", 10))
    s.add_embed(ejob("e", [30, 30, 30, 30]))
    p = s.schedule()
    assert [len(r.tokens) for r in p.runs] == [10] and embeds_of(p) == [30, 30, 30]


def test_embedding_jobs_count_in_the_queue_depth_of_their_class():
    s = sched()
    s.add_embed(ejob("e", [4]))
    assert s.queue_depth()[Qos.EMBEDDING] == 1
    assert Qos.AGENT.rank < Qos.EMBEDDING.rank < Qos.BACKGROUND.rank


def test_an_embedding_job_ages_past_steady_agent_prefill():
    s = Scheduler(lanes=1, n_ctx=4096, step_tokens=64, eog=frozenset({0}), embed_window=48, aging_steps=2)
    s.prefill_budget = s.embed_budget = 16
    s.add(Job("a", list(range(100, 1100)), SamplingParams(), 5, Qos.AGENT))  # a long agent prompt
    s.add_embed(ejob("e", [16]))
    seen = []
    for _ in range(6):
        p = s.schedule()
        seen.append(embeds_of(p))
        s.update(p, answer(p))
    assert seen[0] == [] and [16] in seen  # first the agent's prompt takes the step, then e's turn comes


def test_a_job_in_flight_at_two_worker_deaths_is_given_up():
    s = sched(budget=8)
    s.add_embed(ejob("e", [4, 4]))
    s.add_embed(ejob("f", [40]))
    s.schedule()
    s.reset()
    assert s.embeds.take_poisoned() == []
    s.schedule()
    s.reset()
    assert s.embeds.take_poisoned() == ["e"]  # f never reached a step: it is not to blame
    assert "f" in s.embeds.jobs and "e" not in s.embeds.jobs


def chunk_sched(budget: int = 16) -> Scheduler:
    s = sched(budget=budget, window=200)
    s.embeds.chunks = True
    return s


def test_a_causal_model_s_long_input_comes_in_chunks_and_only_its_last_chunk_has_a_vector():
    s = chunk_sched(budget=16)
    s.add_embed(ejob("e", [40, 4]))
    plans = []
    events = []
    while s.has_work:
        p = s.schedule()
        plans.append([(len(e.tokens), e.pos, e.last) for e in p.embeds])
        events += s.update(p, StepResult(p.step, (), 0.0, tuple(Vector(e.key, b"\0" * 4) for e in p.embeds
                                                               if e.last)))
    assert plans == [[(16, 0, False)], [(16, 16, False)], [(8, 32, True), (4, 0, True)]]
    assert [e.index for e in events] == [0, 1]


def test_no_step_of_a_chunked_model_is_over_its_budget_and_a_chat_prefill_goes_first():
    s = chunk_sched(budget=16)
    s.add_embed(ejob("e", [100]))
    s.schedule()
    s.add(gjob("chat", 10, Qos.AGENT))
    p = s.schedule()
    assert [len(r.tokens) for r in p.runs] == [10] and p.embeds == ()  # 6 tokens left: too small a chunk
    s.update(p, StepResult(p.step, (Sampled(p.runs[0].seq, 7),), 0.0))
    p = s.schedule()
    assert [(len(e.tokens), e.pos) for e in p.embeds] == [(16, 16)]  # beside the chat's decode


def test_a_cancelled_half_sent_input_is_dropped_in_the_runtime():
    s = chunk_sched(budget=16)
    s.add_embed(ejob("e", [100]))
    key = s.schedule().embeds[0].key
    s.finish("e", None)  # type: ignore[arg-type]
    p = s.schedule()
    assert [(e.key, e.tokens) for e in p.embeds] == [(key, ())] and not s.has_work


def test_a_worker_death_restarts_a_half_sent_input_from_its_first_token():
    s = chunk_sched(budget=16)
    s.add_embed(ejob("e", [40]))
    s.schedule()
    s.reset()
    p = s.schedule()
    assert [(len(e.tokens), e.pos) for e in p.embeds] == [(16, 0)] and not s.embeds.drops
