"""Soak: 16 clients for N minutes on every API (OpenAI chat streamed and whole, Anthropic
streamed, Ollama chat, Responses streamed, tool turns), some interactive, with random
disconnects and Last-Event-ID resumes. Then it checks:

- every session's log holds exactly what its clients received (a resumed stream's text
  joined to what was seen before the cut), nothing lost or twice;
- the daemon's RSS and open file descriptors after the first minute (slope per minute);
- p99 time to first token of the interactive class.

    python bench/soak.py [--minutes 10] [--clients 16]"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time

import httpx
import orjson
from common import Daemon

from superfluid.client import iter_sse

MODEL = "SmolLM2-135M-Instruct"
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a code up", "parameters": {
    "type": "object", "properties": {"account": {"type": "string", "maxLength": 12}}, "required": ["account"]}}}


def proc_stats(pid: int) -> tuple[int, int]:
    """(RSS bytes, open fds) of the daemon and its children."""
    rss, fds = 0, 0
    try:
        pids = [pid] + [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        pids = [pid]
    for p in pids:
        try:
            rss += int(open(f"/proc/{p}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            pass
    return rss, fds


class Tally:
    def __init__(self) -> None:
        self.ok = self.errors = self.resumed = self.mismatched = 0
        self.ttft: list[float] = []
        self.checks: list[tuple[str, str]] = []  # (session, text the client got)


async def chat_stream(c: httpx.AsyncClient, t: Tally, rng: random.Random, interactive: bool) -> None:
    body = {"model": MODEL, "max_tokens": rng.randint(4, 24), "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": f"Tell me about the number {rng.randint(0, 999)}."}]}
    headers = {"x-superfluid-qos": "interactive"} if interactive else {}
    cut = rng.random() < 0.3
    seen, last, sid, t0, first = "", None, None, time.perf_counter(), None
    async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        sid = r.headers.get("x-superfluid-session")
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                last = line[4:]
            if line.startswith("data: {"):
                d = orjson.loads(line[6:])
                piece = d["choices"][0]["delta"].get("content") if d["choices"] else None
                if piece:
                    first = first or time.perf_counter()
                    seen += piece
                if cut and piece and rng.random() < 0.3 and last:
                    break
        else:
            cut = False
    if interactive and first:
        t.ttft.append(first - t0)
    if cut and last and sid:
        t.resumed += 1
        async with c.stream("GET", f"/v1/sessions/{sid}/resume", headers={"Last-Event-ID": last}) as r:
            for _, d in iter_sse([ln async for ln in r.aiter_lines()]):
                if isinstance(d, dict) and d.get("choices"):
                    seen += d["choices"][0]["delta"].get("content") or ""
    if sid:
        t.checks.append((sid, seen))
    t.ok += 1


async def other_api(c: httpx.AsyncClient, t: Tally, rng: random.Random) -> None:
    kind = rng.choice(["anthropic", "ollama", "responses", "tool", "whole"])
    msgs = [{"role": "user", "content": f"Say something about {rng.choice(['tea', 'rain', 'maps'])}."}]
    if kind == "anthropic":
        r = await c.post("/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": msgs, "stream": True})
    elif kind == "ollama":
        r = await c.post("/api/chat", json={"model": MODEL, "messages": msgs, "options": {"num_predict": 8}})
    elif kind == "responses":
        r = await c.post("/v1/responses", json={"model": MODEL, "input": msgs[0]["content"],
                                                 "max_output_tokens": 8, "stream": True})
    elif kind == "tool":
        r = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "tools": [TOOL],
                                                        "tool_choice": "required", "max_tokens": 40})
    else:
        r = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 8})
    if r.status_code == 200:
        t.ok += 1
    else:
        t.errors += 1


async def client(url: str, t: Tally, seed: int, until: float) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        while time.monotonic() < until:
            try:
                if rng.random() < 0.5:
                    await chat_stream(c, t, rng, interactive=seed % 4 == 0)
                else:
                    await other_api(c, t, rng)
            except httpx.HTTPError:
                t.errors += 1


async def verify(url: str, t: Tally) -> None:
    """Each checked session's log content equals what its client got."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        for sid, got in t.checks:
            evs = (await c.get(f"/v1/sessions/{sid}/events", params={"limit": 10000})).json()["data"]
            start = max(i for i, e in enumerate(evs) if e["type"] == "generation_prompt")
            logged = "".join(e["text"] for e in evs[start:] if e["type"] == "generated")
            if logged != got:
                t.mismatched += 1
                print(f"session {sid}: the log holds {logged!r}, its client got {got!r}; events "
                      f"{[(e['type'], e.get('finish')) for e in evs[start:]]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    d = Daemon(max_context=1024, threads=args.threads)
    t = Tally()
    samples: list[tuple[float, int, int]] = []
    try:
        t0 = time.monotonic()
        until = t0 + args.minutes * 60

        async def run() -> None:
            tasks = [asyncio.create_task(client(d.url, t, i, until)) for i in range(args.clients)]
            while not all(x.done() for x in tasks):
                samples.append((time.monotonic() - t0, *proc_stats(d.proc.pid)))
                await asyncio.sleep(5)
            await asyncio.gather(*tasks)
            await verify(d.url, t)
        asyncio.run(run())
    finally:
        d.stop()
    late = [s for s in samples if s[0] >= 60] or samples
    per_min = lambda k: (late[-1][k] - late[0][k]) / max(1e-9, (late[-1][0] - late[0][0]) / 60)  # noqa: E731
    ttft = sorted(t.ttft)
    p99 = ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] if ttft else float("nan")
    print(f"requests ok {t.ok}, errors {t.errors}, streams resumed {t.resumed}, "
          f"sessions checked {len(t.checks)}, log != received: {t.mismatched}")
    print(f"RSS {late[-1][1] / 2**20:.0f} MiB, slope {per_min(1) / 2**20:+.1f} MiB/min; "
          f"fds {late[-1][2]}, slope {per_min(2):+.1f}/min (after the first minute)")
    print(f"interactive TTFT p50 {statistics.median(ttft) if ttft else float('nan'):.2f} s, p99 {p99:.2f} s "
          f"({len(ttft)} chats)")


if __name__ == "__main__":
    main()
