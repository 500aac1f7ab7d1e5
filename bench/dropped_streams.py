"""Clients that go away: 8 long streams hold the 8 lanes, their clients hang up, and 8 short
chats arrive right after. Reports the chats' time to first token against an idle daemon's,
and how long the lanes stay busy after the last hang-up, for the default (a dropped stream
is cut at once, and a resume continues it from the log) and `--resume-grace 10` (it keeps
generating 10 s, waiting to be resumed), in the same run.

    python bench/dropped_streams.py [--rounds 3]

Target (issue 14): probe TTFT within 2 x idle + 0.5 s; lanes free within 1 s."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
from common import Daemon, metric, stream_ttft

MODEL = "SmolLM2-135M-Instruct"
LONG = {"model": MODEL, "max_tokens": 600, "ignore_eos": True, "temperature": 0,
        "messages": [{"role": "user", "content": "Write a very long essay about the sea."}]}


def probe(i: int) -> dict:
    return {"model": MODEL, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": f"Say hello to friend number {i}."}]}


async def drop_eight(c: httpx.AsyncClient) -> None:
    """Start 8 long streams, read a few events of each, then hang up on all of them."""
    async def one() -> None:
        async with c.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data: ")
                if n >= 4:
                    return
    await asyncio.gather(*(one() for _ in range(8)))


async def probes(c: httpx.AsyncClient) -> list[float]:
    return [t for t, _ in await asyncio.gather(*(stream_ttft(c, probe(i)) for i in range(8)))]


def lanes_free_after(url: str, t0: float, limit: float = 30.0) -> float:
    while time.perf_counter() - t0 < limit:
        if metric(url, "superfluid_lanes_active") == 0:
            return time.perf_counter() - t0
        time.sleep(0.02)
    return float("inf")


async def one_round(url: str) -> tuple[float, float, float]:
    """(idle probe TTFT median, probe TTFT median after 8 drops, seconds until lanes are free)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        idle = statistics.median(await probes(c))
        await drop_eight(c)  # how long the dropped streams hold the lanes, with nothing else to run
        free = lanes_free_after(url, time.perf_counter())
        await drop_eight(c)  # and what the next clients wait meanwhile
        after = statistics.median(await probes(c))
    while metric(url, "superfluid_lanes_active") > 0:  # the next round starts clean
        time.sleep(0.2)
    return idle, after, free


def run(args, *extra: str) -> tuple[float, float, float]:
    d = Daemon(*extra, max_context=1024, threads=args.threads)
    try:
        rounds = [asyncio.run(one_round(d.url)) for _ in range(args.rounds)]
    finally:
        d.stop()
    return tuple(statistics.median(r[k] for r in rounds) for k in range(3))  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print(f"{'':24} {'idle TTFT':>10} {'after drops':>12} {'target':>8} {'lanes free':>11}")
    for name, extra in (("cut at once (default)", ()), ("--resume-grace 10", ("--resume-grace", "10"))):
        idle, after, free = run(args, *extra)
        print(f"{name:24} {idle:9.2f}s {after:11.2f}s {2 * idle + 0.5:7.2f}s {free:10.2f}s")


if __name__ == "__main__":
    main()
