"""Single-stream decode without speculation: the daemon against llama-server (the xllamacpp
wheel, no speculation, one slot) in the same run, and where the daemon's time per token goes.

    python bench/single_stream.py [--rounds 5] [--tokens 256] [--threads 2] [--intervals 0,50]
                                  [--decode-steps 1,4] [--profile]

One greedy stream at a time, EOS ignored, over the same few open questions on each server,
each server in turn (reversed every other round); decode tok/s is (tokens - 1) / (last token
- first token) as the client sees it. Printed: the median per server and the ratio daemon /
llama-server (and, paired, the geometric mean of the rounds' ratios), and the CPU time per
token of each process (the daemon's API process, its worker, llama-server): on a machine
with as many cores as decode threads, every CPU millisecond the API process spends per token
is taken from the decode. --intervals and --decode-steps: one daemon for each pair of a
--stream-interval-ms and a --decode-steps value. --profile samples the first daemon's
processes with py-spy (pip install py-spy) through three more streams and prints the
functions most sampled.

Needs: pip install xllamacpp (bench only)."""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Daemon, LlamaServerProcess  # noqa: E402
from speculative import QUESTIONS, decode_rate  # noqa: E402

from superfluid.runtime.registry import embedded_model  # noqa: E402


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def profile(pids: dict[str, int], url: str, tokens: int, top: int = 12) -> None:
    """py-spy over each process through one stream: the functions (own time) most sampled."""
    out = Path(tempfile.mkdtemp(prefix="spy-"))
    procs = {name: subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "500", "--format", "raw",
                                     "--nonblocking", "-o", str(out / f"{name}.txt"), "--duration", "600"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, pid in pids.items()}
    time.sleep(1.0)
    for _ in range(3):
        decode_rate(url, {"messages": [{"role": "user", "content": QUESTIONS[0]}], "ignore_eos": True}, tokens)
    for p in procs.values():
        p.send_signal(2)
        p.wait(60)
    for name in pids:
        own: collections.Counter[str] = collections.Counter()
        total = 0
        for line in (out / f"{name}.txt").read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            frames = stack.split(";")
            own[frames[-1]] += int(n)
            total += int(n)
        print(f"{name}: {total} samples, own time")
        for fn, n in own.most_common(top):
            print(f"  {100 * n / max(1, total):5.1f}%  {fn[:150]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--intervals", default="50", help="the daemons' --stream-interval-ms, comma-separated (default 50)")
    ap.add_argument("--decode-steps", default="4", help="the daemons' --decode-steps, comma-separated (default 4)")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    n_ctx = 4096
    daemons = {f"daemon {ms}ms x{n}": Daemon("--stream-interval-ms", ms, "--decode-steps", n, threads=a.threads,
                                             max_context=n_ctx, max_batch=1)
               for ms in a.intervals.split(",") for n in a.decode_steps.split(",")}
    peer = LlamaServerProcess(embedded_model().path, a.threads, n_ctx)
    urls = {**{k: d.url for k, d in daemons.items()}, "llama-server": peer.url}
    pids = {"llama-server": peer.proc.pid}
    for k, d in daemons.items():
        pids[f"{k} api"], pids[f"{k} worker"] = d.proc.pid, d.worker_pid()
    rates: dict[str, list[float]] = {k: [] for k in urls}
    cpu = {k: 0.0 for k in pids}
    made = {k: 0 for k in urls}
    try:
        for url in urls.values():
            decode_rate(url, {"messages": [{"role": "user", "content": "Hello"}], "ignore_eos": True}, 8)
        for r in range(a.rounds):  # each server in turn, reversed every other round
            for name, url in (list(urls.items()) if r % 2 == 0 else list(urls.items())[::-1]):
                body = {"messages": [{"role": "user", "content": QUESTIONS[r % len(QUESTIONS)]}], "ignore_eos": True}
                mine = [k for k in pids if k == name or k.startswith(name + " ")]
                before = {k: cpu_s(pids[k]) for k in mine}
                rate, n = decode_rate(url, body, a.tokens)
                for k in mine:
                    cpu[k] += cpu_s(pids[k]) - before[k]
                made[name] += n
                rates[name].append(rate)
        if a.profile:
            first = next(iter(daemons))
            profile({k: v for k, v in pids.items() if k.startswith(first)}, urls[first], a.tokens)
    finally:
        for d in daemons.values():
            d.stop()
        peer.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"single-stream decode tok/s, median of {a.rounds} rounds, {a.threads} thread(s), {a.tokens} tokens, "
          "greedy, no speculation")
    for k in urls:
        own = {p: v for p, v in cpu.items() if p == k or p.startswith(k + " ")}
        paired = statistics.geometric_mean([x / y for x, y in zip(rates[k], rates["llama-server"], strict=True)])
        print(f"  {k:18s} {med[k]:6.1f} tok/s  {med[k] / med['llama-server']:.3f}x llama-server "
              f"(paired {paired:.3f}x)  CPU ms/token: "
              + "  ".join(f"{p[len(k):].strip() or 'process'} {1000 * v / max(1, made[k]):.2f}"
                          for p, v in own.items()))


if __name__ == "__main__":
    main()
