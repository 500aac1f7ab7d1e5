"""Speculation in the pure scheduler (sched/spec.py, sched/results.py): how many drafts a
decode run is granted, and how a result holding several tokens of one lane is folded in;
and the runtime's prompt-lookup proposer (runtime/speculate.py)."""

import numpy as np

from superfluid.plan import PLACEHOLDER, Sampled, StepResult
from superfluid.request import FinishReason, Qos, SamplingParams
from superfluid.runtime.speculate import LaneTokens, NgramDrafter, propose
from superfluid.sched.scheduler import Job, Scheduler
from superfluid.sched.spec import COOLDOWN, DOUBLINGS

EOG = 0


def sched(spec: int = 4, n_ctx: int = 64) -> Scheduler:
    s = Scheduler(lanes=2, n_ctx=n_ctx, step_tokens=64, eog=frozenset({EOG}))
    s.spec.max_tokens = spec
    return s


def job(jid: str, n: int = 3, max_tokens: int = 20, qos: Qos = Qos.AGENT) -> Job:
    return Job(jid, list(range(100, 100 + n)), SamplingParams(temperature=0), max_tokens, qos)


def decoding(s: Scheduler, j: Job):
    """Admit and prefill `j`, fold in its first token: it decodes from the next plan."""
    s.add(j)
    plan = s.schedule()
    s.update(plan, StepResult(plan.step, (Sampled(j.seq, 7),)))
    return j


def test_a_decode_run_gets_drafts_within_max_tokens_and_in_flight_drafts():
    s = sched(spec=4)
    j = decoding(s, job("a", max_tokens=8))
    first = s.schedule()  # 1 generated; this run's token and 4 drafts: 6 at most
    (run,) = first.runs
    assert run.tokens == (7,) and run.draft == 4
    second = s.schedule()  # in flight: up to 1 + 4 more; with this run's own: 8 - 7 - 1 = 1 draft
    assert second.runs[0].draft == 1 and second.runs[0].tokens == (PLACEHOLDER,)
    # the first comes back with three tokens (two drafts kept): they are the job's output
    s.update(first, StepResult(first.step, (Sampled(j.seq, 11), Sampled(j.seq, 12), Sampled(j.seq, 13)),
                               drafted=((j.seq, 4),)))
    assert j.output == [7, 11, 12, 13] and j.pending == 1
    assert s.counters.draft_tokens == 4 and s.counters.draft_accepted_tokens == 2
    s.update(second, StepResult(second.step, (Sampled(j.seq, 14),)))
    third = s.schedule()  # 5 generated, none in flight: 8 - 5 - 1 = 2 drafts
    assert third.runs[0].draft == 2


def test_no_drafts_near_the_window_nor_while_a_chat_prefills():
    s = sched(spec=8, n_ctx=16)
    decoding(s, job("a", n=10, max_tokens=100))
    assert s.schedule().runs[0].draft == 16 - 11 - 1  # the window, not max_tokens, bounds it
    s = sched(spec=8)
    decoding(s, job("a", max_tokens=100))
    s.add(Job("chat", list(range(200, 240)), SamplingParams(), 10, Qos.INTERACTIVE))
    plan = s.schedule()
    assert any(r.seq != 0 for r in plan.runs)  # the chat prefills in this step
    assert all(r.draft == 0 for r in plan.runs)


def test_a_job_may_carry_its_own_speculation_setting():
    """A fleet head passes its --speculative setting with each generation (GenRequest.speculate):
    the node's own default only applies to a job that carries none."""
    s = sched(spec=0)  # this engine's own setting: off
    own = job("own", max_tokens=100)
    own.speculate = 3
    decoding(s, own)
    assert s.schedule().runs[0].draft == 3
    s = sched(spec=8)
    off = job("off", max_tokens=100)
    off.speculate = 0
    decoding(s, off)
    assert s.schedule().runs[0].draft == 0
    s = sched(spec=8)
    s.spec.supported = False  # a runtime that does not verify drafted rows: none, whatever asked
    asks = job("asks", max_tokens=100)
    asks.speculate = 4
    decoding(s, asks)
    assert s.schedule().runs[0].draft == 0


def test_a_token_that_ends_the_job_drops_the_rest_of_the_run():
    s = sched(spec=4)
    j = decoding(s, job("a", max_tokens=20))
    plan = s.schedule()
    events = s.update(plan, StepResult(plan.step, (Sampled(j.seq, 11), Sampled(j.seq, EOG), Sampled(j.seq, 12)),
                                       drafted=((j.seq, 4),)))
    assert j.output == [7, 11, EOG] and j.finish == FinishReason.END_OF_TURN
    assert [e.token for e in events] == [11, EOG] and events[-1].finish == FinishReason.END_OF_TURN


def test_a_lane_whose_drafts_are_rejected_stops_drafting_for_a_while():
    s = sched(spec=4)
    j = decoding(s, job("a", max_tokens=10_000))
    step = 0
    while True:
        plan = s.schedule()
        if plan.runs[0].draft == 0:
            break
        s.update(plan, StepResult(plan.step, (Sampled(j.seq, 9),), drafted=((j.seq, 4),)))  # none kept
        step += 1
        assert step < 10
    off = 0
    while plan.runs[0].draft == 0:
        s.update(plan, StepResult(plan.step, (Sampled(j.seq, 9),)))
        plan = s.schedule()
        off += 1
    assert COOLDOWN - 2 <= off <= COOLDOWN + 2  # then it tries again


def test_propose_continues_the_most_recent_earlier_ngram():
    ctx = np.array([5, 6, 7, 8, 1, 2, 5, 6, 7, 9, 3, 5, 6, 7])
    assert propose(ctx, 3) == [9, 3, 5]  # "5 6 7" last seen before the end: followed by 9 3 5
    assert propose(np.array([1, 2, 3, 4]), 3) == []  # nothing repeats
    assert propose(ctx, 0) == []
    held = LaneTokens()
    held.fed(0, 0, (1, 2, 3, 4, 1, 2))
    held.keep(1, 0)
    held.copy(0, 1, 4)
    assert held.held[1] == [1, 2, 3, 4]
    ngram = NgramDrafter()
    assert ngram.propose({0: (held.context(0, 3), 2)}) == {0: [4, 1]}  # "2 3" seen before: followed by 4 1
    held.unknown(2, 3)
    held.fed(2, 3, (8, 9))
    assert ngram.propose({2: (held.context(2, 8), 3)}) == {2: []}  # the restored prefix is unknown: nothing to look up


def test_a_lane_gets_as_many_drafts_as_its_acceptance_pays_for():
    s = sched(spec=8)
    j = decoding(s, job("a", max_tokens=10_000))
    plan = s.schedule()
    assert plan.runs[0].draft == 8  # no history yet: the whole allowance
    s.update(plan, StepResult(plan.step, (Sampled(j.seq, 11),), drafted=((j.seq, 8),)))  # none accepted
    assert s.schedule().runs[0].draft == 6  # acceptance average 0.7 -> ceil(8 x 0.7)


def _drafts_while_accepting(share: float, steps: int = 60) -> list[int]:
    """The drafts granted to one lane over `steps` steps when `share` of each step's drafts
    are accepted (a step's accepted drafts come back as that many more sampled tokens)."""
    s = sched(spec=8, n_ctx=4096)
    j = decoding(s, job("a", max_tokens=100_000))
    granted = []
    for _ in range(steps):
        plan = s.schedule()
        k = plan.runs[0].draft
        granted.append(k)
        kept = round(k * share)
        s.update(plan, StepResult(plan.step, tuple(Sampled(j.seq, 11) for _ in range(kept + 1)),
                                  drafted=((j.seq, k),) if k else ()))
    return granted


def test_a_lane_whose_drafts_are_accepted_a_third_of_the_time_mostly_stops_drafting():
    """A verified row costs about half a decoded token on a CPU: a lane whose drafts are
    accepted a third of the time (free chat with suffix drafts) is slower drafting, so it
    stops for a while, again and again; one whose drafts are mostly accepted never stops."""
    third = _drafts_while_accepting(1 / 3)
    assert third.count(0) > len(third) / 2, third
    most = _drafts_while_accepting(0.75)
    assert 0 not in most, most


def test_draft_model_flags_are_checked_before_anything_loads(capsys, tmp_path):
    from superfluid.cli.main import main
    assert main(["serve", "--speculative", "draft", "--port", "1"]) == 2
    assert "--speculative draft needs --draft-model" in capsys.readouterr().err
    (tmp_path / "d.gguf").write_bytes(b"GGUF")
    assert main(["serve", "--draft-model", str(tmp_path / "d.gguf"), "--port", "1"]) == 2
    assert "--draft-model is used with --speculative draft" in capsys.readouterr().err
    assert main(["serve", "--speculative", "draft", "--draft-model", str(tmp_path / "none.gguf"), "--port", "1"]) == 2
    assert "no such file" in capsys.readouterr().err


def _pauses(s: Scheduler, j: Job, n: int, accept_between: int = 0) -> list[int]:
    """The lengths of `n` pauses of a lane whose drafts are all rejected (after each pause,
    `accept_between` steps whose drafts are all accepted first)."""
    pauses = []
    plan = s.schedule()
    for _ in range(n):
        for _ in range(accept_between):
            k = plan.runs[0].draft
            s.update(plan, StepResult(plan.step, tuple(Sampled(j.seq, 11) for _ in range(k + 1)),
                                      drafted=((j.seq, k),) if k else ()))
            plan = s.schedule()
        while plan.runs[0].draft:
            s.update(plan, StepResult(plan.step, (Sampled(j.seq, 9),), drafted=((j.seq, plan.runs[0].draft),)))
            plan = s.schedule()
        off = 0
        while not plan.runs[0].draft:
            s.update(plan, StepResult(plan.step, (Sampled(j.seq, 9),)))
            plan = s.schedule()
            off += 1
        pauses.append(off)
    return pauses


def test_a_lane_that_stops_drafting_again_pauses_twice_as_long_until_its_drafts_are_accepted():
    """Free chat's drafts fail again and again: each pause is twice the last (up to
    COOLDOWN << DOUBLINGS), so the lane's batch keeps its shape longer (llama.cpp builds a new
    graph each time drafts come or go); a lane whose drafts were accepted meanwhile pauses
    COOLDOWN steps again."""
    s = sched(spec=4, n_ctx=100_000)
    j = decoding(s, job("a", max_tokens=100_000))
    expected = [COOLDOWN << min(i, DOUBLINGS) for i in range(DOUBLINGS + 2)]
    got = _pauses(s, j, DOUBLINGS + 2)
    assert all(abs(g - e) <= 2 for g, e in zip(got, expected, strict=True)), (got, expected)
    s = sched(spec=4, n_ctx=100_000)
    j = decoding(s, job("a", max_tokens=100_000))
    got = _pauses(s, j, 3, accept_between=4)  # four steps all accepted: the average is over RATE_GOOD again
    assert all(abs(g - COOLDOWN) <= 2 for g in got), got
