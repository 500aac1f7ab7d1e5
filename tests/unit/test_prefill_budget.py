"""How much each step prefills (engine/budget.py). While a chat is about, steps are sized from
the measured cost per token to stay short, but never below PREFILL_FLOOR rows: llama.cpp's CPU
matmul leaves its batched path below 64 rows, where a prompt prefilled in chunks of 32 took 3x
as long as in chunks of 64. With no chat about, a step prefills the worker's whole batch."""

from __future__ import annotations

from superfluid.engine.budget import CHAT_QUIET_S, PREFILL_FLOOR, StepBudget
from superfluid.request import Qos, SamplingParams
from superfluid.sched.jobs import JobStatus
from superfluid.sched.scheduler import Job, Scheduler


def sched(lanes: int = 8, step_tokens: int = 512) -> Scheduler:
    return Scheduler(lanes=lanes, n_ctx=512, step_tokens=step_tokens, eog=frozenset({0}))


def chat(s: Scheduler, qos: Qos = Qos.INTERACTIVE) -> None:
    s.add(Job(f"r{len(s.jobs)}", [1, 2, 3], SamplingParams(temperature=0), 4, qos))


def adapt(cost_s: float, lanes: int = 8, step_tokens: int = 512, target: float = 0.25) -> int:
    """The prefill budget after one measured step, with a chat waiting."""
    s = sched(lanes, step_tokens)
    chat(s)
    StepBudget(step_target_s=target, step_tokens=step_tokens, lanes=lanes).after_step(s, 100, 100 * cost_s, 0.0)
    return s.prefill_budget


def test_while_a_chat_waits_a_slow_machine_still_prefills_in_chunks_on_the_batched_path():
    assert PREFILL_FLOOR == 64
    assert adapt(0.05) == 64  # 0.25 s / 50 ms a token would be 5: the floor keeps the batched path
    assert adapt(0.05, lanes=64) == 80  # every lane's decode row plus some prefill


def test_while_a_chat_waits_a_fast_machine_prefills_as_much_as_a_step_target_holds():
    assert adapt(0.001) == 250
    assert adapt(0.0001) == 512  # at most the worker's batch
    assert adapt(0.0001, step_tokens=256) == 256


def test_a_prompt_alone_prefills_the_whole_batch_and_a_chat_keeps_steps_short_a_while():
    s = sched()
    b = StepBudget(step_target_s=0.25, step_tokens=512, lanes=8)
    first = s.prefill_budget
    b.after_step(s, 8, 1.0, 0.0)  # a decode step: nothing measured yet, the first budget stands
    assert s.prefill_budget == first == 64
    chat(s, Qos.AGENT)  # an agent's prompt, alone
    b.after_step(s, 100, 5.0, 1.0)  # 50 ms a token
    assert (s.prefill_budget, b.long_steps, s.embed_budget) == (512, True, 64)
    chat(s)  # a chat arrives: steps are short again at once
    b.after_step(s, 100, 5.0, 2.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)
    s.waiting.remove(next(j.id for j in s.jobs.values() if j.qos == Qos.INTERACTIVE))
    b.after_step(s, 100, 5.0, 2.0 + CHAT_QUIET_S)  # gone, but its next message may come
    assert s.prefill_budget == 64
    b.after_step(s, 100, 5.0, 2.1 + CHAT_QUIET_S)
    assert s.prefill_budget == 512


def test_beside_other_work_or_for_a_decode_steps_stay_short():
    s = sched()
    b = StepBudget(step_target_s=0.25, step_tokens=512, lanes=8)
    chat(s, Qos.AGENT)
    chat(s, Qos.AGENT)  # two agents: the second waits on the first's steps
    b.after_step(s, 100, 5.0, 1.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)
    s.waiting.remove("r1")
    job = s.jobs["r0"]
    job.status = JobStatus.DECODING  # one stream decoding alone keeps two plans in flight
    b.after_step(s, 100, 5.0, 2.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)
