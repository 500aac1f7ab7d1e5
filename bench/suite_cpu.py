"""Where the test suite's CPU goes, test by test: a pytest plugin that charges each test with
the CPU time of the pytest process running it and of every process under it (the daemons,
workers, nodes, browsers and CLIs it starts, also those that end during the test), then a
summary by file and by test. The suite is CPU-bound on two cores (idle ~7% of a run), so
its wall time follows its CPU, and this says which tests to make cheaper.

    PYTHONPATH=bench python -m pytest tests --deselect tests/integration/test_agents.py -p suite_cpu
    python bench/suite_cpu.py [--top 40]

Each pytest process appends one JSON line per test to $SUITE_CPU_DIR (default
/tmp/suite-cpu)/<pid>.jsonl: {"test", "self", "children"} in CPU seconds. A module- or
session-scoped daemon is charged to the test whose setup started it, and its later work to
whichever test was running. Delete the folder between runs."""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
from pathlib import Path

import psutil
import pytest

OUT = Path(os.environ.get("SUITE_CPU_DIR", "/tmp/suite-cpu"))


def _snapshot() -> tuple[float, float, dict[tuple[int, float], float]]:
    """(own CPU, CPU of the children reaped so far, {(pid, start): CPU} of the live ones)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = {}
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            live[(p.pid, p.create_time())] = t.user + t.system
        except psutil.Error:
            pass
    return me.ru_utime + me.ru_stime, reaped.ru_utime + reaped.ru_stime, live


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own0, reaped0, live0 = _snapshot()
    yield
    own1, reaped1, live1 = _snapshot()
    # a child alive before and reaped during the test is in `reaped` with its whole life's CPU
    gone = sum(cpu for key, cpu in live0.items() if key not in live1)
    grown = sum(cpu - live0.get(key, 0.0) for key, cpu in live1.items())
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps({"test": item.nodeid, "self": round(own1 - own0, 3),
                            "children": round(reaped1 - reaped0 - gone + grown, 3)}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    rows = [json.loads(line) for f in sorted(OUT.glob("*.jsonl")) for line in f.open()]
    if not rows:
        raise SystemExit(f"nothing in {OUT}: run pytest with -p suite_cpu first")
    total = sum(r["self"] + r["children"] for r in rows)
    print(f"{len(rows)} tests, {total:.0f} CPU-s: {sum(r['self'] for r in rows):.0f} in pytest processes, "
          f"{sum(r['children'] for r in rows):.0f} in the processes they started")
    by_file: collections.Counter[str] = collections.Counter()
    for r in rows:
        by_file[r["test"].split("::")[0]] += r["self"] + r["children"]
    print("\nCPU-s  file")
    for name, cpu in by_file.most_common(a.top):
        print(f"{cpu:6.1f} {name}")
    print("\nCPU-s  (in pytest)  test")
    for r in sorted(rows, key=lambda r: -(r["self"] + r["children"]))[:a.top]:
        print(f"{r['self'] + r['children']:6.1f} {r['self']:6.1f}  {r['test']}")


if __name__ == "__main__":
    main()
