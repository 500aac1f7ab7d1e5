"""Pipeline stages.

    python bench/pipeline.py [--threads 1] [--steps 32] [--contexts 256,2048] [--lanes 1,8]
                             [--fleet] [--rounds 3] [--max-tokens 48]

In process: the transformers runtime's decode rate with 1 and 8 lanes, and a stage's decode
cost per token at a short and a long context (with a KV cache per session it should not grow
with the context).

With --fleet, on loopback through the HTTP API: a daemon with --runtime transformers (the
whole model in its worker) and heads with --pipeline over 1, 2 and 3 stage node processes;
aggregate tokens/s with 1 and 8 concurrent streamed requests (greedy, EOS ignored; median of
alternating rounds), then decode ms/token (median gap between streamed tokens) after a 256-
and a 2048-token prompt on the 2-stage pipeline."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

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


def fleet(a) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.durability import round_
    from tests.integration.daemon import Daemon
    from tests.integration.fleet import Node

    home = str(hf_dir(embedded_model().path).parents[1])  # the stages share the converted folder
    nodes = [Node("--stage", "--threads", str(a.threads), home=home) for _ in range(3)]
    servers = {"direct": Daemon("--runtime", "transformers", "--sessions-cache", home=home, max_context=2304)}
    for k in (1, 2, 3):
        servers[f"{k} stage(s)"] = Daemon("--pipeline", ",".join(f"127.0.0.1:{n.port}" for n in nodes[:k]),
                                          "--sessions-cache", max_context=2304, home=tempfile.mkdtemp())
    try:
        for d in servers.values():
            asyncio.run(round_(d.url, 2, 4, "warm"))
        for lanes in (1, 8):
            runs: dict[str, list[float]] = {name: [] for name in servers}
            for r in range(a.rounds):
                order = list(servers.items()) if r % 2 == 0 else list(reversed(servers.items()))
                for name, d in order:
                    runs[name].append(asyncio.run(round_(d.url, lanes, a.max_tokens, f"{name}{lanes}.{r}")))
            base = statistics.median(runs["direct"])
            for name, xs in runs.items():
                med = statistics.median(xs)
                print(f"{lanes} concurrent, {name:11s}: {med:6.1f} tok/s  (vs direct {med / base:.3f})", flush=True)
        two = servers["2 stage(s)"]
        for ctx in (int(x) for x in a.contexts.split(",")):
            gaps = [asyncio.run(_token_gap(two.url, ctx, a.steps, r)) for r in range(a.rounds)]
            print(f"2-stage pipeline, {ctx}-token prompt: {statistics.median(gaps):.1f} ms/token decode", flush=True)
    finally:
        for d in servers.values():
            d.stop()
        for n in nodes:
            n.stop()


async def _token_gap(url: str, context: int, steps: int, r: int) -> float:
    """Median time between streamed tokens after a prompt of about `context` tokens."""
    import httpx
    words = " ".join(f"w{r}x{i}" for i in range(context // 3))  # about 3 tokens per word
    body = {"model": "SmolLM2-135M-Instruct", "prompt": words[: context * 3], "max_tokens": steps,
            "temperature": 0, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        n = (await client.post("/tokenize", json={"content": body["prompt"]})).json()["tokens"]
        body["prompt"] = n[:context]
        stamps = []
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]
    return 1000 * statistics.median(gaps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--contexts", default="256,2048")
    p.add_argument("--lanes", default="1,8")
    p.add_argument("--fleet", action="store_true", help="also measure pipelines of stage nodes on loopback")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    a = p.parse_args()
    if a.fleet:
        fleet(a)
        return
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
