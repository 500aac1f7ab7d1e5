"""What shortest remaining work first (sched/srpt.py) costs the agents, without the noise of a
shared machine: the real scheduler, driven step by step with a fixed cost model instead of a
model (a step costs `--step-s` plus `--token-s` per token it carries; the defaults are this
machine's llama.cpp figures with one thread, NOTES.md), two plans in flight and 2 KV slots
per lane, as in the engine.

8 agents with distinct documents hold the 8 lanes; a chat of the same class (no header)
arrives `--chat-at` seconds later (then `--chats` - 1 more, one every `--every` seconds).
Reports the chats' median TTFT and the agents' total time (to the last agent's last token),
with SRPT on and off.

    python bench/srpt_steps.py [--prompt 478] [--max-tokens 64] [--budget 43]

For wall-clock figures on the real daemon: bench/agents_interactive.py --srpt."""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superfluid.plan import Sampled, StepResult  # noqa: E402
from superfluid.request import SamplingParams  # noqa: E402
from superfluid.sched.scheduler import Job, Scheduler  # noqa: E402


def run(srpt: bool, a: argparse.Namespace) -> tuple[float, float, int]:
    """(chats' median TTFT s, agents' total s, short preemptions)."""
    s = Scheduler(lanes=a.agents, slots=2 * a.agents, n_ctx=4096, step_tokens=256, eog=frozenset({-1}), srpt=srpt)
    s.prefill_budget = a.budget
    for i in range(a.agents):
        s.add(Job(f"agent{i}", [100_000 * (i + 1) + k for k in range(a.prompt)], SamplingParams(temperature=0),
                  a.max_tokens))
    t, inflight, sent, ttft, ends = 0.0, collections.deque(), {}, {}, {}
    while True:
        if len(sent) < a.chats and t >= a.chat_at + a.every * len(sent):
            c = f"chat{len(sent)}"
            s.add(Job(c, [7 + len(sent)] + list(range(7, 7 + a.chat_prompt)), SamplingParams(temperature=0), 16))
            sent[c] = t
        while len(inflight) < 2 and (plan := s.schedule()) is not None:
            inflight.append(plan)
        if not inflight:
            if len(sent) == a.chats:
                break
            t = a.chat_at + a.every * len(sent)
            continue
        plan = inflight.popleft()
        t += a.step_s + a.token_s * sum(len(r.tokens) for r in plan.runs)
        for e in s.update(plan, StepResult(plan.step, tuple(Sampled(r.seq, 5) for r in plan.runs if r.sample))):
            if e.job_id in sent and e.job_id not in ttft:
                ttft[e.job_id] = t - sent[e.job_id]
            if e.finish:
                ends[e.job_id] = t
    agents = max(v for k, v in ends.items() if k not in sent)
    return statistics.median(ttft.values()), agents, s.counters.short_preemptions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=478, help="agent prompt tokens (450 words of bench/common.document)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--chat-prompt", type=int, default=40)
    ap.add_argument("--chat-at", type=float, default=2.0)
    ap.add_argument("--chats", type=int, default=1)
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--budget", type=int, default=43, help="prefill tokens per step (the engine's for 250 ms steps)")
    ap.add_argument("--step-s", type=float, default=0.0107, help="fixed cost of a step (1 / 93 tok/s decode)")
    ap.add_argument("--token-s", type=float, default=0.0058, help="cost per token (1 / 172 tok/s prefill)")
    a = ap.parse_args()
    print(f"{a.agents} agents x {a.prompt}-token prompts (max_tokens {a.max_tokens}), "
          f"{a.chats} x {a.chat_prompt}-token chat of their class from {a.chat_at} s, every {a.every} s; "
          f"cost model {a.step_s * 1000:.1f} ms + {a.token_s * 1000:.1f} ms/token")
    res = {on: run(on, a) for on in (True, False)}
    for on, (ttft, total, shorts) in res.items():
        print(f"  SRPT {'on ' if on else 'off'}  chat TTFT (median) {ttft:7.2f} s   agents' total {total:7.2f} s"
              f"   (short preemptions {shorts})")
    print(f"  agents' total, on / off: {res[True][1] / res[False][1]:.4f}")


if __name__ == "__main__":
    main()
