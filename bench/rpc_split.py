"""A GGUF split over llama.cpp RPC nodes inside Link F, against the same model on one machine
and against today's --pipeline (transformers stages), on loopback, in one run.

    python bench/rpc_split.py [--threads 1] [--rounds 3] [--tokens 64] [--prompt-words 600] [--no-pipeline]

Setups, each a real daemon (and node processes) driven over HTTP:
- one machine: `superfluid serve` (the embedded GGUF, llama.cpp);
- rpc: `serve --rpc-nodes` over the head's CPU and 2 `node serve --rpc` nodes (a 3-way split);
- pipeline: `serve --pipeline` over 2 `node serve --stage` nodes (transformers, float32).

Per setup, median of rounds: decode tok/s (one greedy stream, EOS ignored: tokens after the
first ÷ the time they took) and prefill tok/s (a distinct prompt each round: prompt tokens ÷
time to the first token). Ratios are against one machine (target for rpc: >= 0.8). Peak RSS
(VmHWM) of every process of the setup, and for rpc nodes RSS ÷ (file size × share): about 1
means the node holds its share of the quantized weights, not a float32 copy."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time

import httpx
import psutil

from common import Daemon, document  # noqa: F401  (common puts the repo on sys.path)

from superfluid.runtime.registry import embedded_model
from tests.integration.fleet import Node

MODEL = "SmolLM2-135M-Instruct"


def peak_rss(pid: int) -> int:
    """VmHWM of the process and its children (the daemon's worker), bytes."""
    total = 0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                total += next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM"))
        except (OSError, StopIteration):
            pass
    return total


async def decode_rate(url: str, tokens: int) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
            "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    stamps = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as c, c.stream("POST", "/v1/chat/completions",
                                                                            json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content"' in line:
                stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 2 else float("nan")


async def prefill_rate(url: str, i: int, words: int) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"{i}: " + document(i, words)}],
            "max_tokens": 1, "temperature": 0}
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        t0 = time.perf_counter()
        r = await c.post("/v1/chat/completions", json=body)
        dt = time.perf_counter() - t0
    return r.json()["usage"]["prompt_tokens"] / dt


def measure(name: str, url: str, a, pids: dict[str, int]) -> dict:
    asyncio.run(decode_rate(url, 8))  # warm: the first request pays for loading
    dec, pre = [], []
    for r in range(a.rounds):
        dec.append(asyncio.run(decode_rate(url, a.tokens)))
        pre.append(asyncio.run(prefill_rate(url, 1000 * r + hash(name) % 997, a.prompt_words)))
    out = {"decode": statistics.median(dec), "prefill": statistics.median(pre),
           "rss": {k: peak_rss(p) for k, p in pids.items()}}
    print(f"{name:>12}: decode {out['decode']:6.1f} tok/s   prefill {out['prefill']:6.1f} tok/s   "
          + "  ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in out["rss"].items()), flush=True)
    return out


def split(a, node_args: list[str], head_flag: list[str], head_args: list[str], tok: str | None,
          idle: list[int]) -> dict:
    """A head over 2 node processes (`node serve` + node_args), measured; `idle` gets each
    node's RSS before any head (Python and llama.cpp, no weights)."""
    nodes = [Node(*node_args, "--threads", str(a.threads), auth_file=tok) for _ in range(2)]
    idle += [peak_rss(n.proc.pid) for n in nodes]
    name = "rpc 3-way" if node_args == ["--rpc"] else "pipeline 2"
    try:
        head = Daemon(*head_flag, ",".join(f"127.0.0.1:{n.port}" for n in nodes), *head_args, "--sessions-cache",
                      "--no-tui", max_batch=2, threads=a.threads)
        try:
            return measure(name, head.url, a, {"head": head.proc.pid, "node1": nodes[0].proc.pid,
                                               "node2": nodes[1].proc.pid})
        finally:
            head.stop()
    finally:
        for n in nodes:
            n.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=600)
    p.add_argument("--no-pipeline", action="store_true")
    a = p.parse_args()
    size = os.path.getsize(embedded_model().path)
    tok = os.path.join(tempfile.mkdtemp(), "token")
    with open(tok, "w") as f:
        f.write(secrets.token_hex(32))
    results = {}
    one = Daemon("--sessions-cache", "--no-tui", max_batch=2, threads=a.threads)
    try:
        results["one machine"] = measure("one machine", one.url, a, {"daemon": one.proc.pid})
    finally:
        one.stop()
    idle: list[int] = []
    results["rpc 3-way"] = split(a, ["--rpc"], ["--rpc-nodes"], ["--fleet-auth", tok], tok, idle)
    if not a.no_pipeline:
        results["pipeline 2"] = split(a, ["--stage"], ["--pipeline"], [], None, [])
    base = results["one machine"]
    print(f"\nmodel file {size / 2**20:.0f} MiB, {a.threads} thread(s) per process, median of {a.rounds}")
    print("| setup | decode tok/s | ÷ one machine | prefill tok/s | ÷ one machine |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['decode']:.1f} | {r['decode'] / base['decode']:.2f} | {r['prefill']:.1f} | "
              f"{r['prefill'] / base['prefill']:.2f} |")
    rpc = results.get("rpc 3-way")
    if rpc:
        for k, before in zip(("node1", "node2"), idle, strict=True):
            grew = rpc["rss"][k] - before
            print(f"rpc {k}: peak RSS {rpc['rss'][k] / 2**20:.0f} MiB, {grew / 2**20:.0f} MiB over an idle node "
                  f"= {grew / (size / 3):.2f} x (file size x 1/3)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
