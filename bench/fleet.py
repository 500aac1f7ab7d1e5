"""The fleet's cost and its failover gap.

    python bench/fleet.py [--max-tokens 128] [--rounds 3] [--case all|throughput|failover|cache]

1. Aggregate completion tokens/s through a head -> node on loopback vs a plain daemon with
   the same settings on the same machine, 1 and 8 concurrent streamed requests (greedy, EOS
   ignored, distinct prompts), alternating rounds, median. Target: ratio >= 0.9.
2. Failover gap: a stream runs on one of two nodes; that node is SIGKILLed; the longest
   silence the client sees in the next 60 tokens, counted from the kill (tokens already
   on their way when it died arrive first). A dead node refuses the head's redial, so its
   work moves at once (a node that cannot be reached at all gets --fleet-grace, default 1 s);
   the gap is mostly re-prefilling the prompt plus the delivered tokens on the other node.
   Target: <= 1 s plus the re-prefill time.
3. Cache-aware placement (`--case cache`): 2 nodes (--max-context 4096), 8 agents with
   distinct ~2k-token contexts, 3 turns each; each turn re-sends the whole conversation as a
   new chat request, after a seeded random pause of 1 to --think seconds (default 30: the
   agent's tool call), as agents do; agents start at seeded random times within --stagger
   seconds (default 60).
   Prefill tokens (prompt_tokens - cached_tokens, summed over every response: what the
   nodes prefilled) with the default load-aware placement (cache-aware) against
   least-loaded, each on fresh nodes. Target: >= 2x fewer."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
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


WORDS = ("harbor", "lantern", "gull", "tide", "rope", "anchor", "keel", "mast", "buoy", "reef", "pier", "sail")


def agent_context(k: int) -> str:
    """About 2,000 tokens of notes only agent k has (a file it read, say)."""
    rng = random.Random(k)
    return "\n".join(f"agent {k} note {i}: the {rng.choice(WORDS)} log shows {rng.randrange(10**6)} at "
                     f"{rng.choice(WORDS)} {rng.randrange(1000)}, then {rng.choice(WORDS)}." for i in range(67))


async def agent(client: httpx.AsyncClient, url: str, k: int, turns: int, rng: random.Random,
                stagger: float, think: float) -> list[tuple[int, int]]:
    msgs = [{"role": "system", "content": "You are a coding agent. Answer in one short line."},
            {"role": "user", "content": agent_context(k) + "\nWhich harbor value is largest?"}]
    out = []
    await asyncio.sleep(rng.uniform(0, stagger))  # agents start at different times
    for t in range(turns):
        r = await client.post(url + "/v1/chat/completions", json={
            "model": MODEL, "messages": msgs, "max_tokens": 16, "temperature": 0})
        if r.status_code != 200:
            raise RuntimeError(f"agent {k} turn {t}: {r.status_code} {r.text}")
        body = r.json()
        u = body["usage"]
        out.append((u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0))
        msgs += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                 {"role": "user", "content": f"Tool result {t}: ok. Now check note {t * 7} again."}]
        await asyncio.sleep(rng.uniform(1, think))  # the agent runs a tool (tests, a build, a search)
    return out


async def agents(url: str, n: int, turns: int, seed: int, stagger: float,
                 think: float) -> list[list[tuple[int, int]]]:
    async with httpx.AsyncClient(timeout=3600) as c:
        return await asyncio.gather(*(agent(c, url, k, turns, random.Random(seed * 100 + k), stagger, think)
                                      for k in range(n)))


def cache_placement(a) -> None:
    totals = {}
    for policy in ("load-aware", "least-loaded"):
        n1, n2 = Node(max_context=4096), Node(max_context=4096)
        head = Daemon("--fleet", f"127.0.0.1:{n1.port},127.0.0.1:{n2.port}", "--fleet-policy", policy,
                      max_context=4096, home=tempfile.mkdtemp())
        try:
            t0 = time.monotonic()
            runs = asyncio.run(agents(head.url, a.agents, a.turns, a.seed, a.stagger, a.think))
            wall = time.monotonic() - t0
        except BaseException:
            head.stop()
            print(head.proc.stdout.read()[-4000:], n1.log()[-2000:], n2.log()[-2000:], sep="\n", file=sys.stderr)
            raise
        finally:
            head.stop()
            n1.stop()
            n2.stop()
        prompt = sum(p for run in runs for p, _ in run)
        first = sum(p - c for run in runs for p, c in run[:1])
        later = sum(p - c for run in runs for p, c in run[1:])
        totals[policy] = first + later
        print(f"{policy:>12}: prefill {first + later} tokens of {prompt} prompt tokens "
              f"(first turns {first}, later turns {later}); {wall:.0f} s", flush=True)
    ratio = totals["least-loaded"] / max(1, totals["load-aware"])
    print(f"cache-aware placement prefills {ratio:.2f}x fewer tokens than least-loaded "
          f"({a.agents} agents, {a.turns} turns, 2 nodes, starts within {a.stagger:.0f} s, "
          f"tool pauses of 1-{a.think:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--case", choices=("all", "throughput", "failover", "cache"), default="all")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stagger", type=float, default=60.0, help="agents start at random times within S seconds")
    ap.add_argument("--think", type=float, default=30.0, help="an agent's tool call between turns: 1 to S seconds")
    a = ap.parse_args()
    if a.case in ("all", "throughput"):
        throughput(a)
    if a.case in ("all", "failover"):
        failover_gap(a)
    if a.case in ("all", "cache"):
        cache_placement(a)


if __name__ == "__main__":
    main()
