"""The fleet's cost and its failover gap.

    python bench/fleet.py [--max-tokens 128] [--rounds 3]

1. Aggregate completion tokens/s through a head -> node on loopback vs a plain daemon with
   the same settings on the same machine, 1 and 8 concurrent streamed requests (greedy, EOS
   ignored, distinct prompts), alternating rounds, median. Target: ratio >= 0.9.
2. Failover gap: a stream runs on one of two nodes; that node is SIGKILLed; the longest
   silence the client sees in the next 60 tokens, counted from the kill (tokens already
   on their way when it died arrive first). A dead node refuses the head's redial, so its
   work moves at once (a node that cannot be reached at all gets --fleet-grace, default 1 s);
   the gap is mostly re-prefilling the prompt plus the delivered tokens on the other node.
   Target: <= 1 s plus the re-prefill time."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.durability import round_  # noqa: E402
from tests.integration.daemon import Daemon  # noqa: E402
from tests.integration.fleet import Node  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"


def throughput(a) -> None:
    node = Node(max_context=1024)
    head = Daemon("--fleet", f"127.0.0.1:{node.port}", home=tempfile.mkdtemp())
    direct = Daemon(home=tempfile.mkdtemp())
    try:
        for d in (head, direct):
            asyncio.run(round_(d.url, 2, 8, "warm"))
        for lanes in (1, 8):
            runs: dict[str, list[float]] = {"fleet": [], "direct": []}
            for r in range(a.rounds):
                order = (("fleet", head), ("direct", direct)) if r % 2 == 0 else (("direct", direct), ("fleet", head))
                for name, d in order:
                    runs[name].append(asyncio.run(round_(d.url, lanes, a.max_tokens, f"{name}{lanes}.{r}")))
            f, dr = statistics.median(runs["fleet"]), statistics.median(runs["direct"])
            print(f"{lanes} concurrent: head->node {f:6.1f} tok/s, direct {dr:6.1f} tok/s, ratio {f / dr:.3f}",
                  flush=True)
    finally:
        head.stop()
        direct.stop()
        node.stop()


def failover_gap(a) -> None:
    gaps = []
    for r in range(a.rounds):
        n1, n2 = Node(max_context=1024), Node(max_context=1024)
        head = Daemon("--fleet", f"127.0.0.1:{n1.port},127.0.0.1:{n2.port}", home=tempfile.mkdtemp())
        try:
            body = {"model": MODEL, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True,
                    "messages": [{"role": "user", "content": f"[{r}] Write a long story about a harbor."}]}
            stamps: list[float] = []
            with httpx.stream("POST", head.url + "/v1/chat/completions", json=body, timeout=120) as resp:
                n = 0
                for line in resp.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    choices = json.loads(line[6:])["choices"]
                    if not choices or not choices[0]["delta"].get("content"):
                        continue
                    n += 1
                    if stamps:
                        stamps.append(time.monotonic())
                        if len(stamps) > 60:
                            break
                    if n == 20:
                        placed = next(iter(head.health()["models"].values()))["nodes"]
                        victim = n1 if placed[0]["placed"] else n2
                        stamps.append(time.monotonic())
                        victim.kill()
            gaps.append(max(b - a for a, b in zip(stamps, stamps[1:], strict=False)))
            print(f"round {r}: failover gap {gaps[-1] * 1000:.0f} ms", flush=True)
        finally:
            head.stop()
            n1.stop()
            n2.stop()
    print(f"failover gap: median {statistics.median(gaps) * 1000:.0f} ms over {len(gaps)} rounds "
          f"(includes re-prefilling the prompt and the 20 delivered tokens)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    throughput(a)
    failover_gap(a)


if __name__ == "__main__":
    main()
