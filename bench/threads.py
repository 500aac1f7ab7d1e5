"""llama.cpp thread count and OpenMP wait policy: can the daemon use every core without the
spin penalty (NOTES.md: with threads = cores, any other busy process made decode 30-50x
slower, because ggml's OpenMP threads spin at every barrier while a descheduled peer
holds the step back)?

    python bench/threads.py [--rounds 3] [--tokens 64] [--prompt-words 600]

For each setting (threads, OMP_WAIT_POLICY of the worker), a real daemon on loopback: one
greedy stream's decode tok/s (EOS ignored) and one distinct prompt's prefill tok/s (prompt
tokens / time to the first token), on an idle machine and with a competing process that
keeps one core busy (as a test client, another daemon or the daemon's own Python would).
Median of rounds."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys

from common import Daemon  # noqa: F401  (common puts the repo on sys.path)
from rpc_split import decode_rate, prefill_rate

SETTINGS = [(1, ""), (os.cpu_count() or 2, ""), (os.cpu_count() or 2, "PASSIVE")]


def run(threads: int, policy: str, a, busy: bool) -> tuple[float, float]:
    env = dict(os.environ)
    os.environ.pop("OMP_WAIT_POLICY", None)
    if policy:
        os.environ["OMP_WAIT_POLICY"] = policy
    try:
        d = Daemon("--sessions-cache", "--no-tui", max_batch=2, threads=threads)
    finally:
        os.environ.clear()
        os.environ.update(env)
    spinner = None
    try:
        asyncio.run(decode_rate(d.url, 8))
        if busy:
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        dec, pre = [], []
        for r in range(a.rounds):
            dec.append(asyncio.run(decode_rate(d.url, a.tokens)))
            pre.append(asyncio.run(prefill_rate(d.url, 7000 + 100 * r + threads + 10 * busy + len(policy),
                                                a.prompt_words)))
        return statistics.median(dec), statistics.median(pre)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
        d.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=600)
    a = p.parse_args()
    print("| threads | OMP_WAIT_POLICY | decode idle | decode, 1 core busy | prefill idle | prefill, 1 core busy |")
    print("|---|---|---|---|---|---|")
    for threads, policy in SETTINGS:
        idle = run(threads, policy, a, busy=False)
        busy = run(threads, policy, a, busy=True)
        print(f"| {threads} | {policy or 'default'} | {idle[0]:.1f} | {busy[0]:.1f} | {idle[1]:.1f} | {busy[1]:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
