"""How many prompt tokens the next steps prefill: short steps while anyone may be waiting on
one, the worker's whole batch for a prompt alone, one step for a burst of prompts it can finish.

Short steps exist to let other work in: a step in flight is never cut, so a request that
arrives waits for it. While an interactive request was seen in the last CHAT_QUIET_S, or an
embedding batch waits, a step's prefill is sized from the measured cost per token to take
about `step_target_s`. Otherwise a job alone prefills as much as the worker's batch holds
(`--step-tokens`, llama.cpp's micro-batch), as llama-server always does: at depth small chunks
cost a long prompt dearly (8,192 tokens cold on two cores: 94 s in 64-token chunks, 69 s in
256, 50 s in 512; docs/performance.md); and prompts that can all finish in one step finish in
it (a burst of requests: the whole batch with nothing decoding, one short step's worth per
prompt per stream beside decoding streams), so they do not go one chunk after another.
Such steps are long, so the engine then keeps one plan in flight, not two (`long_steps`): a
request that arrives waits for one step at most, after which steps are short again."""

from __future__ import annotations

from ..request import Qos
from ..sched import srpt
from ..sched.jobs import JobStatus

EMBED_STEP_MAX = 16384  # most embedding tokens in one step, however fast the model
# rows of a step's batch below which llama.cpp's CPU matmul leaves its batched path: a prompt
# prefilled in chunks of 32-63 tokens took 1.7-3x as long as in chunks of 64 or more
# (docs/performance.md), so a step never shrinks below it, however slow the measured tokens
PREFILL_FLOOR = 64
CHAT_QUIET_S = 60.0  # a chat seen this recently keeps steps short (its next message may come)
# a plan of decodes alone runs as many forwards as take about this long (sched/multistep.py):
# a request that arrives waits for the two plans in flight, 100 ms at most
DECODE_PLAN_S = 0.05


class StepBudget:
    """Sets the scheduler's prefill and embedding budgets after each step (`after_step`)."""

    def __init__(self, *, step_target_s: float, step_tokens: int, lanes: int, decode_steps: int = 1):
        self.step_target_s = step_target_s
        self.decode_steps = decode_steps  # the most forwards a plan of decodes alone may run
        self.decode_cost = 0.0  # seconds per forward in such plans (EMA)
        self.step_tokens = step_tokens
        self.lanes = lanes
        self.token_cost = 0.0  # seconds per token in prefill-heavy steps (EMA)
        self.chat_at = float("-inf")  # when an interactive request was last running or waiting
        self.long_steps = False  # the last budget was the whole batch, for a job alone

    def after_step(self, sched, n_tokens: int, elapsed_s: float, now: float, forwards: int = 0) -> None:
        """`forwards`: the decode steps a plan of decodes alone ran (0: another kind of plan)."""
        if forwards and elapsed_s > 0 and self.decode_steps > 1:
            cost = elapsed_s / forwards
            self.decode_cost = cost if not self.decode_cost else 0.8 * self.decode_cost + 0.2 * cost
            sched.decode_steps = max(1, min(self.decode_steps, round(DECODE_PLAN_S / self.decode_cost)))
        if any(j.qos == Qos.INTERACTIVE for j in sched.running.values()) or sched.waiting.count(Qos.INTERACTIVE):
            self.chat_at = now
        if n_tokens >= 16 and elapsed_s > 0:
            cost = elapsed_s / n_tokens
            self.token_cost = cost if not self.token_cost else 0.8 * self.token_cost + 0.2 * cost
        if not self.token_cost:
            return  # nothing measured yet: the scheduler's small first budget stands
        want = int(self.step_target_s / self.token_cost)
        short = min(self.step_tokens, max(PREFILL_FLOOR, self.lanes + 16, want))
        budget = short
        if now - self.chat_at > CHAT_QUIET_S and not sched.embeds.has_work:
            budget = self._widened(sched, short)
        self.long_steps = budget > short
        sched.prefill_budget = budget
        sched.embed_budget = min(EMBED_STEP_MAX, max(64, want))

    def _widened(self, sched, short: int) -> int:
        """The step's budget with no chat about. A prompt alone: the worker's whole batch. Else
        short steps, unless the prompts that lanes hold can all finish in one step no longer
        than the streams beside them should wait: with nothing decoding, the whole batch; else
        one short step for each prompt per decoding stream (a burst of requests beside one
        stream gets its first tokens in one step, not one chunk after another; long prompts
        still go in short steps, so a chat that arrives waits one short step)."""
        running = list(sched.running.values())
        decoding = sum(j.status == JobStatus.DECODING for j in running)
        prompts = [j for j in running if j.status == JobStatus.PREFILLING]
        prompts += list(sched.waiting)[:max(0, self.lanes - len(running))]
        if len(running) + len(sched.waiting) == 1 and prompts:
            return self.step_tokens
        if not prompts:
            return short
        cap = self.step_tokens if not decoding else min(self.step_tokens, short * -(-len(prompts) // decoding))
        need = decoding + sum(srpt.prefill_left(j) for j in prompts)  # decode rows share the step
        return max(short, need) if need <= cap else short
