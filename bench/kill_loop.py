"""Durability under fire: SIGKILL the daemon at random moments, 100 times, restarting it on the
same home each time, while greedy streams (chat completions, Anthropic Messages and Responses
in turn) and a writer of native appends run
(tests/integration/kill_loop.py has the loop; the suite runs 20 kills of it).

    python bench/kill_loop.py [--kills 100] [--streams 8] [--budget 48] [--seed 1]

Checked: every stream, resumed across the kills from its Last-Event-ID, ends with the uncut
text (every token once); every acknowledged append is in the log once; no KV temp file is
left. Reported: those counts, and the restart time (process start to /health) at the first
and last kill, which must not grow with the kills.

Measured (2026-12-03, two cores, the embedded model): 100 kills, 8 streams of 48 tokens over
chat completions, Anthropic Messages and Responses: 787 reconnections resumed cut streams, 17
generations ended whole (7 chat, 5 Messages, 5 Responses; 1,200 tokens), none differing from
the uncut text; 1,254 acknowledged appends, each in the log once; no temp file left; restart
2.26 s at the first kill, 2.13 s at the last (median 2.09 s, max 2.76 s)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

import common  # noqa: F401  (puts the repository on sys.path)

from tests.integration.kill_loop import run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    out = run(tempfile.mkdtemp(prefix="kill-loop-"), kills=a.kills, streams=a.streams, budget=a.budget, seed=a.seed,
              daemon_args=("--deterministic",))  # greedy identity across batch shapes (test_kill_loop.py)
    r = out["restart_s"][1:]
    out["restart"] = {"first_kill_s": r[0], "last_kill_s": r[-1], "median_s": statistics.median(r),
                      "max_s": max(r)} if r else {}
    out["ok"] = not out["mismatches"] and not out["log_errors"] and not out["tmp_files"]
    out["mismatches"] = out["mismatches"][:3]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
