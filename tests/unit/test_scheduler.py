"""The pure scheduler: admission, continuous batching, chunked prefill, finishing."""

import pytest

from superfluid.plan import Sampled, StepPlan, StepResult
from superfluid.request import FinishReason, Qos, SamplingParams
from superfluid.sched.scheduler import Job, JobStatus, Scheduler

EOG = 0


def sched(lanes: int = 2, n_ctx: int = 64, step_tokens: int = 16) -> Scheduler:
    return Scheduler(lanes=lanes, n_ctx=n_ctx, step_tokens=step_tokens, eog=frozenset({EOG}))


def job(jid: str, n: int = 3, max_tokens: int = 10, qos: Qos = Qos.AGENT, **sp) -> Job:
    return Job(jid, list(range(100, 100 + n)), SamplingParams(**sp), max_tokens, qos)


def result(plan: StepPlan, tokens: dict[int, int] | None = None, default: int = 7) -> StepResult:
    """One sampled token per run that asked for one (tokens: seq -> token)."""
    tokens = tokens or {}
    return StepResult(plan.step, tuple(Sampled(r.seq, tokens.get(r.seq, default))
                                       for r in plan.runs if r.sample))


def step(s: Scheduler, tokens: dict[int, int] | None = None, default: int = 7):
    plan = s.schedule()
    return plan, s.update(plan, result(plan, tokens, default))


def runs_by_seq(plan: StepPlan) -> dict[int, tuple[int, int, bool]]:
    return {r.seq: (r.pos, len(r.tokens), r.sample) for r in plan.runs}


# -- admission and batching ------------------------------------------------------------


def test_admission_is_fifo_up_to_the_lane_count():
    s = sched(lanes=2)
    for j in ("a", "b", "c"):
        s.add(job(j))
    plan = s.schedule()
    assert [o.seq for o in plan.opens] == [0, 1]
    assert [j.id for j in s.running.values()] == ["a", "b"]
    assert [j.id for j in s.waiting] == ["c"]
    assert s.jobs["c"].status == JobStatus.WAITING
    # both prompts are fed whole and sampled after
    assert [(r.seq, r.pos, r.tokens, r.sample) for r in plan.runs] == [
        (0, 0, (100, 101, 102), True), (1, 0, (100, 101, 102), True)]


def test_interactive_job_is_admitted_before_older_agent_jobs():
    s = sched(lanes=1)
    s.add(job("agent"))
    s.add(job("chat", qos=Qos.INTERACTIVE))
    s.schedule()
    assert [j.id for j in s.running.values()] == ["chat"]


def test_a_job_added_while_others_decode_joins_at_the_next_step():
    s = sched(lanes=2)
    s.add(job("a", n=3))
    plan, ev = step(s, default=42)
    assert [(e.job_id, e.token) for e in ev] == [("a", 42)]
    assert s.jobs["a"].status == JobStatus.DECODING

    s.add(job("b", n=4))
    plan = s.schedule()
    assert [o.seq for o in plan.opens] == [1]
    runs = {r.seq: r for r in plan.runs}
    # a decodes its last sampled token at the next position; b prefills in the same step
    assert (runs[0].pos, runs[0].tokens, runs[0].sample) == (3, (42,), True)
    assert (runs[1].pos, runs[1].tokens, runs[1].sample) == (0, (100, 101, 102, 103), True)
    ev = s.update(plan, result(plan, {0: 8, 1: 9}))
    assert [(e.job_id, e.token) for e in ev] == [("a", 8), ("b", 9)]
    assert s.jobs["a"].output == [42, 8]


def test_decode_feeds_one_token_per_step_at_increasing_positions():
    s = sched(lanes=1)
    s.add(job("a", n=2, max_tokens=100))
    step(s, default=11)
    for i, tok in enumerate([12, 13, 14]):
        plan, _ = step(s, default=tok)
        assert [(r.pos, r.tokens, r.sample) for r in plan.runs] == [(2 + i, (11 + i,), True)]
    assert s.jobs["a"].output == [11, 12, 13, 14]


def test_chunked_prefill_respects_the_step_budget_and_decodes_come_first():
    s = sched(lanes=2, step_tokens=4)
    s.add(job("a", n=2, max_tokens=100))
    step(s)  # a prefilled, now decoding
    s.add(job("b", n=10, max_tokens=100))
    seen = []
    for _ in range(4):
        plan, ev = step(s)
        assert plan.runs[0].seq == 0 and len(plan.runs[0].tokens) == 1  # the decode is first
        assert plan.n_tokens <= 4
        seen.append(runs_by_seq(plan)[1])
        if seen[-1][2]:
            assert [e.job_id for e in ev] == ["a", "b"]
        else:
            assert [e.job_id for e in ev] == ["a"]  # b does not sample mid-prompt
    # (pos, n, sample): b's 10 prompt tokens over 4 steps, sampling only at the end
    assert seen == [(0, 3, False), (3, 3, False), (6, 3, False), (9, 1, True)]
    assert s.jobs["b"].status == JobStatus.DECODING


def test_prefill_chunks_carry_the_right_tokens():
    s = sched(lanes=1, step_tokens=4)
    s.add(Job("a", list(range(1, 11)), SamplingParams(), 10))
    chunks = []
    while True:
        plan, ev = step(s)
        chunks.append(plan.runs[0].tokens)
        if ev:
            break
    assert chunks == [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10)]


def test_prefill_budget_goes_to_the_oldest_admission_first_without_srpt():
    # with shortest remaining work first (the default) b would go first: tests/unit/test_srpt.py
    s = Scheduler(lanes=2, n_ctx=64, step_tokens=4, eog=frozenset({EOG}), srpt=False)
    s.add(job("a", n=6))
    s.add(job("b", n=3))
    plan = s.schedule()
    assert runs_by_seq(plan) == {0: (0, 4, False)}  # b gets nothing this step
    s.update(plan, result(plan))
    plan = s.schedule()
    assert runs_by_seq(plan) == {0: (4, 2, True), 1: (0, 2, False)}


def test_job_context_spans_prompt_and_output():
    j = Job("a", [1, 2, 3], SamplingParams(), 10, output=[4, 5])
    assert j.context_len == 5
    assert j.context(1, 3) == (2, 3, 4)
    assert j.context(0, 5) == (1, 2, 3, 4, 5)
    assert j.context(3, 2) == (4, 5)
    assert j.context(4, 1) == (5,)


# -- update and finish reasons ----------------------------------------------------------


def test_update_turns_sampled_tokens_into_token_events():
    s = sched()
    s.add(job("a"))
    plan = s.schedule()
    top = ((7, -0.1), (3, -2.5))
    ev = s.update(plan, StepResult(plan.step, (Sampled(0, 7, -0.1, top),)))
    assert len(ev) == 1
    e = ev[0]
    assert (e.job_id, e.token, e.logprob, e.top, e.finish) == ("a", 7, -0.1, top, None)


def test_eog_token_ends_the_turn_and_the_lane_closes_next_step():
    s = sched(lanes=1)
    s.add(job("a"))
    s.add(job("b"))
    _, ev = step(s, default=EOG)
    assert [(e.job_id, e.token, e.finish) for e in ev] == [("a", EOG, FinishReason.END_OF_TURN)]
    assert "a" not in s.jobs and not s.running
    plan = s.schedule()
    assert plan.closes == (0,)
    assert [o.seq for o in plan.opens] == [0]  # the lane is reused by b
    assert s.running[0].id == "b"


def test_ignore_eos_keeps_generating_past_an_eog_token():
    s = sched()
    s.add(job("a", ignore_eos=True))
    _, ev = step(s, default=EOG)
    assert ev[0].finish is None
    assert s.jobs["a"].status == JobStatus.DECODING


def test_max_tokens_finishes_with_length():
    s = sched()
    s.add(job("a", max_tokens=3))
    finishes = [step(s)[1][0].finish for _ in range(3)]
    assert finishes == [None, None, FinishReason.LENGTH]
    assert "a" not in s.jobs
    assert s.schedule().closes == (0,)


def test_context_window_finishes_with_length():
    s = sched(n_ctx=8)
    s.add(job("a", n=6, max_tokens=100))
    finishes = [step(s)[1][0].finish for _ in range(2)]
    assert finishes == [None, FinishReason.LENGTH]
    assert s.schedule().closes == (0,)


def test_prompt_one_short_of_the_window_gets_exactly_one_token():
    s = sched(n_ctx=8)
    s.add(job("a", n=7, max_tokens=100))
    _, ev = step(s)
    assert ev[0].finish == FinishReason.LENGTH


# -- validation ----------------------------------------------------------------------------


def test_step_tokens_must_cover_every_lane():
    with pytest.raises(ValueError):
        Scheduler(lanes=4, n_ctx=64, step_tokens=3, eog=frozenset())


def test_at_least_one_lane():
    with pytest.raises(ValueError):
        Scheduler(lanes=0, n_ctx=64, step_tokens=4, eog=frozenset())


def test_add_rejects_duplicate_empty_and_oversized_jobs():
    s = sched(n_ctx=8)
    s.add(job("a"))
    with pytest.raises(ValueError, match="duplicate"):
        s.add(job("a"))
    with pytest.raises(ValueError, match="empty"):
        s.add(Job("e", [], SamplingParams(), 5))
    with pytest.raises(ValueError, match="context"):
        s.add(job("big", n=8))
    assert set(s.jobs) == {"a"} and len(s.waiting) == 1


# -- plans scheduled ahead of results (two in flight) --------------------------------


def test_decode_ahead_uses_placeholder_for_the_token_in_flight():
    from superfluid.plan import PLACEHOLDER
    s = sched(lanes=1)
    s.add(job("a", n=3))
    p1 = s.schedule()  # prefill, samples at the end
    p2 = s.schedule()  # decode of the token p1 will sample
    assert p1.runs[0].tokens == (100, 101, 102) and p1.runs[0].sample
    assert p2.runs[0].pos == 3 and p2.runs[0].tokens == (PLACEHOLDER,) and p2.runs[0].sample
    ev1 = s.update(p1, result(p1, {0: 11}))
    p3 = s.schedule()  # p2's token is still in flight: placeholder again, one position on
    assert p3.runs[0].pos == 4 and p3.runs[0].tokens == (PLACEHOLDER,)
    ev2 = s.update(p2, result(p2, {0: 12}))
    s.update(p3, result(p3, {0: 13}))
    p4 = s.schedule()  # everything has arrived: the real token
    assert p4.runs[0].pos == 5 and p4.runs[0].tokens == (13,)
    assert [e.token for e in ev1 + ev2] == [11, 12]
    assert s.jobs["a"].output == [11, 12, 13]


def test_no_run_is_scheduled_past_max_tokens():
    s = sched(lanes=1)
    s.add(job("a", max_tokens=2))
    p1, p2 = s.schedule(), s.schedule()
    assert s.schedule() is None  # two samples in flight cover max_tokens
    s.update(p1, result(p1))
    evs = s.update(p2, result(p2))
    assert evs[-1].finish == FinishReason.LENGTH
    assert s.schedule().closes == (0,)


def test_token_in_flight_after_eog_is_dropped_and_lane_reuse_is_safe():
    s = sched(lanes=1)
    s.add(job("a"))
    p1, p2 = s.schedule(), s.schedule()
    evs = s.update(p1, result(p1, {0: EOG}))
    assert evs[-1].finish == FinishReason.END_OF_TURN
    s.add(job("b"))
    p3 = s.schedule()  # closes a's lane and gives it to b while p2 (a's run) is in flight
    assert p3.closes == (0,) and p3.opens[0].seq == 0
    assert s.update(p2, result(p2, {0: 99})) == []  # a's extra token: nobody's
    evs = s.update(p3, result(p3, {0: 5}))
    assert [(e.job_id, e.token) for e in evs] == [("b", 5)]


def test_update_refuses_a_result_for_another_step():
    s = sched(lanes=1)
    s.add(job("a"))
    p1, p2 = s.schedule(), s.schedule()
    with pytest.raises(ValueError):
        s.update(p1, result(p2))


def test_big_opens_spread_over_steps_so_no_step_is_over_the_frame_cap():
    """Sixteen lanes, each with its own grammar at the request limit, and lanes whose
    penalties need their long prompts: a step's opens carry at most STEP_OPEN_BYTES and the
    rest open in the next steps; lanes sharing one grammar (the choices of one request)
    carry it once. Every plan encodes under the frame cap."""
    import msgpack

    from superfluid.limits import MAX_GRAMMAR_BYTES
    from superfluid.link.frame import MAX_FRAME
    from superfluid.plan import STEP_OPEN_BYTES
    s = sched(lanes=40, n_ctx=400_000, step_tokens=512)
    for i in range(16):
        s.add(job(f"g{i}", grammar=f"start: \"{i}\" | " + "x" * (MAX_GRAMMAR_BYTES - 20)))
    shared = "start: " + "y" * (MAX_GRAMMAR_BYTES - 10)
    for i in range(8):
        s.add(job(f"n{i}", grammar=shared))
    for i in range(8):  # a repeat penalty over the whole context: the prompt goes with the open
        s.add(Job(f"p{i}", [100 + i] * 300_000, SamplingParams(repeat_penalty=1.1, repeat_last_n=-1), 10))
    opened: list[str] = []
    for _ in range(20):
        plan = s.schedule()
        if plan is None:
            break
        opened += [s.running[o.seq].id for o in plan.opens]
        s.update(plan, result(plan))
        wire = msgpack.packb(plan.to_wire())
        assert len(wire) < MAX_FRAME
        carried = len({o.sampling.grammar for o in plan.opens}) * MAX_GRAMMAR_BYTES + \
            5 * sum(len(o.context) for o in plan.opens)
        assert carried <= STEP_OPEN_BYTES + 5 * 300_000
        assert StepPlan.from_wire(msgpack.unpackb(wire)) == plan
    assert sorted(opened) == sorted([f"g{i}" for i in range(16)] + [f"n{i}" for i in range(8)] +
                                    [f"p{i}" for i in range(8)])


def test_penalty_context_is_the_prompt_before_this_turn_within_repeat_last_n():
    prompt = [1, 2, 3, 4, 5, 6]
    plain = Job("a", prompt, SamplingParams(), 10)
    assert plain.penalty_context() == ()  # no penalty: nothing to send
    whole = Job("b", prompt, SamplingParams(presence_penalty=1.0), 10, prior=(5, 6))
    assert whole.penalty_context() == (1, 2, 3, 4)
    last = Job("c", prompt, SamplingParams(repeat_penalty=1.1, repeat_last_n=3), 10, prior=(6,))
    assert last.penalty_context() == (3, 4, 5)
