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


def prompt(s: Scheduler, n: int) -> None:
    s.add(Job(f"r{len(s.jobs)}", list(range(1, n + 1)), SamplingParams(temperature=0), 4, Qos.AGENT))


def test_prompts_one_step_can_finish_take_it_and_long_ones_stay_short():
    s = sched()
    b = StepBudget(step_target_s=0.25, step_tokens=512, lanes=8)
    prompt(s, 200)
    prompt(s, 200)  # two prompts, nothing decoding: both finish in one step of the batch
    b.after_step(s, 100, 5.0, 1.0)
    assert (s.prefill_budget, b.long_steps) == (400, True)
    prompt(s, 200)  # three no longer fit one step: short steps, a chat that comes waits one
    b.after_step(s, 100, 5.0, 1.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)


def admitted(s: Scheduler, status: JobStatus, n: int = 50) -> None:
    prompt(s, n)
    job = s.jobs[f"r{len(s.jobs) - 1}"]
    s.waiting.remove(job.id)
    job.status, job.seq = status, len(s.running)
    s.running[job.seq] = job


def test_a_burst_beside_a_decoding_stream_is_prefilled_in_one_step():
    s = sched()
    b = StepBudget(step_target_s=0.25, step_tokens=512, lanes=8)
    admitted(s, JobStatus.DECODING)  # one stream decoding alone keeps two plans in flight
    b.after_step(s, 100, 5.0, 2.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)
    admitted(s, JobStatus.PREFILLING, 200)  # one long prompt beside one stream: its steps stay short
    b.after_step(s, 100, 5.0, 2.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)
    s.running.pop(1)
    for _ in range(7):  # a burst: 7 prompts of 50 tokens beside one stream: 350 + its row in one step
        prompt(s, 50)
    b.after_step(s, 100, 5.0, 2.0)
    assert (s.prefill_budget, b.long_steps) == (351, True)
    admitted(s, JobStatus.DECODING)  # two streams: 3 short steps' worth (192) cannot finish 6 x 50
    b.after_step(s, 100, 5.0, 2.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)
    s.running.pop(1)
    s.waiting.remove(next(iter(s.waiting)).id)
    chat(s)  # a chat about: short steps again, whoever else waits
    b.after_step(s, 100, 5.0, 3.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)


def test_waiting_prompts_count_only_as_far_as_free_lanes_hold_them():
    s = sched(lanes=2)
    b = StepBudget(step_target_s=0.25, step_tokens=512, lanes=2)
    admitted(s, JobStatus.DECODING)
    for _ in range(5):  # one free lane: one 50-token prompt can prefill beside the stream, in a short step
        prompt(s, 50)
    b.after_step(s, 100, 5.0, 2.0)
    assert (s.prefill_budget, b.long_steps) == (64, False)
