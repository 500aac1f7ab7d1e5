"""How many llama.cpp threads a step may use: every core the worker was given, fewer while
other processes keep cores busy.

llama.cpp is built without OpenMP here (`-DGGML_OPENMP=OFF`, scripts/llama-build.sh): its own
threadpool hands out work in chunks and its threads spin at each operator's barrier. On a
quiet machine that is much faster than OpenMP threads that sleep at every barrier (decode
+25-45% on two cores, docs/performance.md). But a spinning barrier waits for a thread that
another process has descheduled: with one of two cores busy elsewhere, two threads decoded
20-30% slower than OpenMP's passive ones. So the worker watches the machine: every
`PERIOD_S` it reads how much CPU the rest of the machine used (all processes' time from
/proc/stat, hypervisor steal included, less this process's own) and gives llama.cpp the
cores that are left: `threads_for`. One thread has no barrier to wait at.

Steps ask for the count, so a look taken after the worker was idle (no step for a period,
and under half a core used since the last look) describes a time it did not compete: another
server's answer, an agent's test run between two turns. The count is kept and the machine
looked at again QUICK_S later: otherwise a request that came after another process's burst
began with one thread for a whole period (measured: a single stream, each request right
after llama-server's, 0.89x llama-server with such looks trusted, 0.99x without them,
docs/performance.md)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

PERIOD_S = 0.5  # how often the machine is looked at
SPARE = 0.5  # cores of other work tolerated before a thread is given up
QUICK_S = 0.1  # the next look after one that spanned an idle worker
IDLE = 0.5  # cores: a worker with no step for a period that used less than this was idle


def threads_for(others: float, most: int) -> int:
    """Threads for a step when other processes used `others` cores lately (at most `most`,
    at least one): a core is given up once others use more than half of one."""
    return max(1, min(most, most - math.ceil(others - SPARE)))


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU since boot, steal counted as busy."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    guest = sum(v[8:10]) if len(v) > 9 else 0  # guest time is also counted in user and nice
    total = sum(v) - guest
    return total - idle, total


def _own_ticks() -> int:
    t = os.times()
    return round((t.user + t.system) * os.sysconf("SC_CLK_TCK"))


class ThreadGovernor:
    """`threads(now)`: the count for the next step; `apply(n)` is called when it changes."""

    def __init__(self, most: int, apply: Callable[[int], None], *,
                 machine: Callable[[], tuple[int, int]] = _machine_ticks,
                 own: Callable[[], int] = _own_ticks, cpus: int | None = None):
        self.most, self.current = most, most
        self._apply, self._machine, self._own = apply, machine, own
        self._cpus = cpus or os.cpu_count() or 1  # /proc/stat counts every CPU of the machine
        self._last: tuple[float, int, int, int] | None = None
        self._period = PERIOD_S  # until the next look
        self._asked: float | None = None  # when a step last asked
        self.others = 0.0  # cores the rest of the machine used in the last period

    def threads(self, now: float | None = None) -> int:
        if self.most <= 1:
            return self.most
        now = time.monotonic() if now is None else now
        gap, self._asked = (0.0 if self._asked is None else now - self._asked), now
        if self._last is not None and now - self._last[0] < self._period:
            return self.current
        try:
            busy, total = self._machine()
            own = self._own()
        except (OSError, ValueError, IndexError):
            return self.current  # no /proc: keep what we have
        if self._last is not None:
            _, busy0, total0, own0 = self._last
            if total > total0:
                mine = self._cpus * (own - own0) / (total - total0)
                self.others = max(0.0, self._cpus * (busy - busy0) / (total - total0) - mine)
                idle = gap > PERIOD_S and mine < IDLE
                self._period = QUICK_S if idle else PERIOD_S
                if not idle:
                    n = threads_for(self.others, self.most)
                    if n != self.current:
                        self.current = n
                        self._apply(n)
        self._last = (now, busy, total, own)
        return self.current
