"""The engine sizes each step's prefill from the measured cost per token, to keep steps short,
but never below PREFILL_FLOOR rows: llama.cpp's CPU matmul leaves its batched path below 64
rows, where a prompt prefilled in chunks of 32 took 3x as long as in chunks of 64."""

from __future__ import annotations

from types import SimpleNamespace

from superfluid.engine.local import PREFILL_FLOOR, Engine
from superfluid.sched.scheduler import Scheduler


def adapt(cost_s: float, lanes: int = 8, step_tokens: int = 256, target: float = 0.25) -> int:
    eng = SimpleNamespace(cfg=SimpleNamespace(step_target_s=target, step_tokens=step_tokens, max_batch=lanes),
                          sched=Scheduler(lanes=lanes, n_ctx=512, step_tokens=step_tokens, eog=frozenset({0})),
                          _token_cost=0.0)
    Engine._adapt_budget(eng, SimpleNamespace(n_tokens=100), SimpleNamespace(elapsed_s=100 * cost_s))
    return eng.sched.prefill_budget


def test_a_slow_machine_still_prefills_in_chunks_on_the_batched_path():
    assert PREFILL_FLOOR == 64
    assert adapt(0.05) == 64  # 0.25 s / 50 ms a token would be 5: the floor keeps the batched path
    assert adapt(0.05, lanes=64) == 80  # every lane's decode row plus some prefill


def test_a_fast_machine_prefills_as_much_as_a_step_target_holds():
    assert adapt(0.001) == 250
    assert adapt(0.0001) == 256  # at most the worker's batch
