"""Pipeline stages, in process (no fleet yet): the transformers runtime's decode rate with 1
and 8 lanes, and a stage's decode cost per token at a short and a long context (with a KV
cache per session it should not grow with the context). The fleet engineer extends this to
1/2/3 stages on loopback.

    python bench/pipeline.py [--threads 1] [--steps 32] [--contexts 256,2048] [--lanes 1,8]"""

from __future__ import annotations

import argparse
import time

import numpy as np

from superfluid.plan import PLACEHOLDER, LaneOpen, Run, StepPlan
from superfluid.request import SamplingParams
from superfluid.runtime.hf_convert import hf_dir
from superfluid.runtime.registry import embedded_model
from superfluid.runtime.stage import StageInput, StageModel
from superfluid.runtime.transformers import TransformersRuntime


def lanes_rate(rt: TransformersRuntime, lanes: int, steps: int) -> float:
    """Aggregate decode tokens/s with `lanes` lanes decoding together (after a short prefill)."""
    prompt = (1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198)
    greedy = SamplingParams(temperature=0, ignore_eos=True)
    rt.step(StepPlan(0, opens=tuple(LaneOpen(s, greedy) for s in range(lanes)),
                     runs=tuple(Run(s, 0, prompt, True) for s in range(lanes))))
    t0 = time.perf_counter()
    for i in range(steps):
        rt.step(StepPlan(1 + i, runs=tuple(Run(s, len(prompt) + i, (PLACEHOLDER,), True) for s in range(lanes))))
    dt = time.perf_counter() - t0
    rt.step(StepPlan(steps + 1, closes=tuple(range(lanes))))
    return lanes * steps / dt


def decode_ms(stage: StageModel, context: int, steps: int) -> float:
    rng = np.random.default_rng(0)
    toks = rng.integers(100, 40000, size=context).tolist()
    for a in range(0, context, 256):  # prefill in chunks, as the scheduler would
        stage.forward([StageInput("s", a, tokens=toks[a:a + 256])])
    t0 = time.perf_counter()
    for i in range(steps):
        stage.forward([StageInput("s", context + i, tokens=[7])])
    dt = time.perf_counter() - t0
    stage.drop("s")
    return 1000 * dt / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--contexts", default="256,2048")
    p.add_argument("--lanes", default="1,8")
    a = p.parse_args()
    t0 = time.perf_counter()
    folder = hf_dir(embedded_model().path)
    print(f"GGUF -> HF folder: {time.perf_counter() - t0:.1f} s ({folder})")
    lanes = [int(x) for x in a.lanes.split(",")]
    rt = TransformersRuntime(str(folder), lanes=max(lanes), n_ctx=4096, threads=a.threads)
    for n in lanes:
        print(f"transformers runtime, {n} lane(s): {lanes_rate(rt, n, a.steps):.1f} tok/s decode (aggregate)")
    for ctx in (int(x) for x in a.contexts.split(",")):
        print(f"1 stage (all layers), context {ctx}: {decode_ms(rt.model, ctx, a.steps):.1f} ms/token decode")
    rt.close()


if __name__ == "__main__":
    main()
