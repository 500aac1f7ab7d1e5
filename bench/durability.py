"""What the durable session log costs: aggregate tokens/s at 8 concurrent streamed requests
through a daemon with the fsync'd SQLite store vs the same daemon with the throwaway
in-memory store (--sessions-cache), alternating rounds in the same run; plus the store's
commit latency (p50/p99 per transaction; a step's tokens for every lane share one).

    python bench/durability.py [--lanes 8] [--max-tokens 128] [--rounds 5]

Greedy, EOS ignored, distinct prompts per round (no prefix-cache hits); the time counts from
the first request sent to the last token received. Target: ratio >= 0.95."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import stream_ttft  # noqa: E402
from tests.integration.daemon import Daemon  # noqa: E402


async def round_(url: str, lanes: int, max_tokens: int, tag: str) -> float:
    bodies = [{"model": "SmolLM2-135M-Instruct", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
               "messages": [{"role": "user", "content": f"[{tag}.{i}] Write a long story about river {i}."}]}
              for i in range(lanes)]
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(stream_ttft(client, b) for b in bodies))
        return lanes * max_tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    common = ("--threads", str(a.threads))
    durable = Daemon(*common, max_batch=a.lanes, max_context=1024, home=tempfile.mkdtemp(prefix="sf-durable-"))
    cache = Daemon(*common, "--sessions-cache", max_batch=a.lanes, max_context=1024,
                   home=tempfile.mkdtemp(prefix="sf-cache-"))
    try:
        for d in (durable, cache):  # warm up both
            asyncio.run(round_(d.url, a.lanes, 8, "warm"))
        runs: dict[str, list[float]] = {"durable": [], "cache": []}
        for r in range(a.rounds):
            for name, d in (("durable", durable), ("cache", cache)) if r % 2 == 0 else \
                    (("cache", cache), ("durable", durable)):
                tps = asyncio.run(round_(d.url, a.lanes, a.max_tokens, f"{name}{r}"))
                runs[name].append(tps)
                print(f"round {r} {name:8s} {tps:7.1f} tok/s", flush=True)
        store = durable.health()["store"]
        med = {k: statistics.median(v) for k, v in runs.items()}
        ratio = med["durable"] / med["cache"]
        print(f"\n{a.lanes} lanes x {a.max_tokens} tokens, median of {a.rounds} rounds:")
        print(f"  fsync'd store   {med['durable']:7.1f} tok/s")
        print(f"  throwaway store {med['cache']:7.1f} tok/s")
        print(f"  ratio           {ratio:.3f}  (target >= 0.95)")
        print(f"  commits {store['commits']}, latency p50 {store['commit_p50_ms']} ms, "
              f"p99 {store['commit_p99_ms']} ms (last 1024 transactions)")
    finally:
        durable.stop()
        cache.stop()


if __name__ == "__main__":
    main()
