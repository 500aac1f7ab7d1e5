"""Raw decode speed of llama.cpp builds side by side: the same llama-cpp-python loop
(throughput.RawLoop: 16 sequences x 2,048 like the daemon, greedy, a 101-token prompt per
lane, then --tokens) run by each build in turn, rounds interleaved, median of --reps per
process. A build is a directory a wheel was installed into (pip install --no-deps --target
DIR WHEEL), or `installed` for the one on the path.

    python bench/builds.py installed /tmp/avx2lib [--rounds 3] [--threads 2] [--lanes 1,8]

What it found (docs/performance.md, "Instruction sets"): -march=native decoded 25-35% slower
than the same CPU's instruction sets named one by one."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(threads: int, lanes: list[int], tokens: int, reps: int) -> dict:
    """In this process, with whichever llama_cpp is first on the path."""
    sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]
    import llama_cpp
    from throughput import RawLoop

    from superfluid.runtime.registry import embedded_model
    loop = RawLoop(embedded_model().path, 16, 2048, threads, 512)
    prompt = [1] + list(range(1000, 1100))
    got: dict[str, list[float]] = {}
    for _ in range(reps):
        for n in lanes:
            loop.run([prompt[:] for _ in range(n)], tokens + 1)
            got.setdefault(str(n), []).append(tokens * n / loop.decode_s)
    info = llama_cpp.llama_print_system_info().decode().strip()
    return {"info": info, "tok_s": {k: statistics.median(v) for k, v in got.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--lanes", default="1,8")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    lanes = [int(x) for x in a.lanes.split(",")]
    if a.child:
        print(json.dumps(measure(a.threads, lanes, a.tokens, a.reps)))
        return
    runs: dict[str, list[dict]] = {b: [] for b in a.builds}
    for r in range(a.rounds):
        for b in a.builds:
            env = dict(os.environ)
            if b != "installed":
                env["PYTHONPATH"] = os.pathsep.join([b] + [p for p in [env.get("PYTHONPATH")] if p])
            out = subprocess.run([sys.executable, __file__, "x", "--child", "--threads", str(a.threads),
                                  "--tokens", str(a.tokens), "--reps", str(a.reps), "--lanes", a.lanes],
                                 env=env, capture_output=True, text=True, check=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            runs[b].append(res)
            print(f"round {r + 1} {b}: " + ", ".join(f"{k} lanes {v:.1f} tok/s" for k, v in res["tok_s"].items()),
                  flush=True)
    print(f"\ndecode tok/s, {a.threads} threads, median over {a.rounds} rounds of medians of {a.reps}:")
    for b, rs in runs.items():
        print(f"  {b}: " + ", ".join(f"{n} lanes {statistics.median(x['tok_s'][str(n)] for x in rs):.1f}"
                                      for n in lanes) + f"   [{rs[0]['info']}]")


if __name__ == "__main__":
    main()
