"""A GGUF split over llama.cpp RPC nodes inside Link F, against the same model on one machine
and against --pipeline (transformers stages), on loopback, in one run.

    python bench/rpc_split.py [--threads 1] [--rounds 3] [--tokens 64] [--prompt-words 600] [--no-pipeline]
                              [--rpc-output head[,last]]

Setups, each a real daemon (and node processes) driven over HTTP:
- one machine: `superfluid serve` (the embedded GGUF, llama.cpp);
- rpc: `serve --rpc-nodes` over the head's CPU and 2 `node serve --rpc` nodes (a 3-way split),
  once per `--rpc-output` placement of the output layer (head: the default; last);
- pipeline: `serve --pipeline` over 2 `node serve --stage` nodes (transformers, float32).

Every setup is up at once and each round measures them all, in alternating order (a noisy
moment on a shared machine hits every setup alike). Per setup, median of rounds: decode
tok/s (one greedy stream, EOS ignored: tokens after the first ÷ the time they took) and
prefill tok/s (a distinct prompt each round: prompt tokens ÷ time to the first token).
Ratios are against one machine (target for rpc: >= 0.8): the ratio of the medians, and for
decode also the median of each round's ratio (setups measured back to back, so a baseline
that drifts between rounds cancels out). Peak RSS (VmHWM) of every process
of the setup, and for rpc nodes RSS ÷ (file size × share): about 1
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


def measure(setups: dict[str, tuple[str, dict[str, int]]], a) -> dict:
    """Every setup is up at once (idle ones wait passively); each round measures them all,
    in an order that alternates, so a noisy moment on a shared machine hits every setup
    alike."""
    for url, _ in setups.values():
        asyncio.run(decode_rate(url, 8))  # warm: the first request pays for loading
    dec: dict[str, list[float]] = {k: [] for k in setups}
    pre: dict[str, list[float]] = {k: [] for k in setups}
    names = list(setups)
    for r in range(a.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            url = setups[name][0]
            dec[name].append(asyncio.run(decode_rate(url, a.tokens)))
            pre[name].append(asyncio.run(prefill_rate(url, 1000 * r + names.index(name), a.prompt_words)))
        print(f"round {r + 1}: " + "   ".join(f"{k} decode {dec[k][-1]:.1f} prefill {pre[k][-1]:.1f}" for k in names),
              flush=True)
    out = {}
    base = names[0]  # one machine: each round's ratio pairs setups measured back to back
    for name, (_, pids) in setups.items():
        out[name] = {"decode": statistics.median(dec[name]), "prefill": statistics.median(pre[name]),
                     "paired": statistics.median(d / b for d, b in zip(dec[name], dec[base], strict=True)),
                     "rss": {k: peak_rss(p) for k, p in pids.items()}}
        print(f"{name:>12}: decode {out[name]['decode']:6.1f} tok/s   prefill {out[name]['prefill']:6.1f} tok/s   "
              + "  ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in out[name]["rss"].items()), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=600)
    p.add_argument("--no-pipeline", action="store_true")
    p.add_argument("--rpc-output", default="head", help="the output layer's placements to run: head, last or both")
    a = p.parse_args()
    size = os.path.getsize(embedded_model().path)
    tok = os.path.join(tempfile.mkdtemp(), "token")
    with open(tok, "w") as f:
        f.write(secrets.token_hex(32))
    procs: list = []
    setups: dict[str, tuple[str, dict[str, int]]] = {}
    try:
        one = Daemon("--sessions-cache", "--no-tui", max_batch=2, threads=a.threads)
        procs.append(one)
        setups["one machine"] = (one.url, {"daemon": one.proc.pid})
        kinds = [(f"rpc 3-way {o}", ["--rpc"], ["--rpc-nodes"], ["--fleet-auth", tok, "--rpc-output", o], tok)
                 for o in a.rpc_output.split(",")]
        if not a.no_pipeline:
            kinds.append(("pipeline 2", ["--stage"], ["--pipeline"], [], None))
        idle: dict[str, list[int]] = {}
        for name, node_args, head_flag, head_args, auth in kinds:
            nodes = [Node(*node_args, "--threads", str(a.threads), auth_file=auth) for _ in range(2)]
            procs += nodes
            if name.startswith("rpc"):  # each node's RSS before any head: Python and llama.cpp, no weights
                idle[name] = [peak_rss(n.proc.pid) for n in nodes]
            head = Daemon(*head_flag, ",".join(f"127.0.0.1:{n.port}" for n in nodes), *head_args,
                          "--sessions-cache", "--no-tui", max_batch=2, threads=a.threads)
            procs.append(head)
            setups[name] = (head.url, {"head": head.proc.pid, "node1": nodes[0].proc.pid,
                                       "node2": nodes[1].proc.pid})
        results = measure(setups, a)
    finally:
        for x in reversed(procs):
            x.stop()
    base = results["one machine"]
    print(f"\nmodel file {size / 2**20:.0f} MiB, {a.threads} thread(s) per process, median of {a.rounds}")
    print("| setup | decode tok/s | ÷ one machine | median of rounds' ÷ | prefill tok/s | ÷ one machine |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['decode']:.1f} | {r['decode'] / base['decode']:.2f} | {r['paired']:.2f} | "
              f"{r['prefill']:.1f} | {r['prefill'] / base['prefill']:.2f} |")
    for name, before_each in idle.items():
        rpc = results[name]
        for k, before in zip(("node1", "node2"), before_each, strict=True):
            grew = rpc["rss"][k] - before
            print(f"{name} {k}: peak RSS {rpc['rss'][k] / 2**20:.0f} MiB, {grew / 2**20:.0f} MiB over an idle "
                  f"node = {grew / (size / 3):.2f} x (file size x 1/3)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
