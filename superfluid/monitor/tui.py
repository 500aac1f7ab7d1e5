"""The live monitor `superfluid serve` shows on a terminal: lanes, queues, KV, rates with a
sparkline, TTFT percentiles, prefix reuse, preemptions, worker restarts and a log pane.

`Dashboard.render()` builds one frame from the engines' stats() (engine.contract.EngineStats;
pure: easy to test at a fixed size); a fleet head's frame shows its nodes' lanes, a row
each, with the node they run on; `LiveMonitor` refreshes it twice a second and hands the screen back to plain
logs when the operator presses `q` (Ctrl-C still stops the server)."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..net.logline import OneLine

SPARK = "▁▂▃▄▅▆▇█"
PHASES = {"prefilling": "prefill", "decoding": "decode"}


def sparkline(values: list[float], width: int = 30) -> str:
    vals = values[-width:]
    if not vals:
        return ""
    top = max(vals) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1)))] for v in vals)


class LogBuffer(logging.Handler):
    """Keeps the last log lines for the log pane instead of scrolling the terminal."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.lines: deque[str] = deque(maxlen=n)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class Dashboard:
    def __init__(self, engines: dict, url: str, logs: LogBuffer, clock=time.monotonic):
        self.engines, self.url, self.logs, self.clock = engines, url, logs, clock
        self.started = clock()
        self._prev: dict[str, tuple[float, int, int]] = {}
        self.decode_rates: dict[str, deque[float]] = {}
        self.prefill_rates: dict[str, deque[float]] = {}

    def sample(self) -> None:
        """Take a rate sample (call about once a second)."""
        now = self.clock()
        for mid, eng in self.engines.items():
            c = eng.stats().counters
            dec, pre = c.get("decode_tokens", 0), c.get("prefill_tokens", 0)
            prev = self._prev.get(mid)
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                self.decode_rates.setdefault(mid, deque(maxlen=60)).append(max(0, dec - prev[1]) / dt)
                self.prefill_rates.setdefault(mid, deque(maxlen=60)).append(max(0, pre - prev[2]) / dt)
            self._prev[mid] = (now, dec, pre)

    def render(self):
        parts = []
        for mid, eng in self.engines.items():
            parts.append(self._model(mid, eng))
        logs = Text("\n".join(self.logs.lines) or "(no log lines yet)", style="dim")
        parts.append(Panel(logs, title="log", title_align="left"))
        up = int(self.clock() - self.started)
        return Panel(Group(*parts), title=f"superfluid on {self.url}  up {up // 60}m{up % 60:02d}s  (q: plain logs, "
                                          f"Ctrl-C: stop)", title_align="left")

    def _model(self, mid: str, eng) -> Panel:
        s = eng.stats()
        c = s.counters
        used, total = s.kv_used, s.kv_total
        dec = list(self.decode_rates.get(mid, []))
        pre = list(self.prefill_rates.get(mid, []))
        p50 = f"{s.ttft_p50:.2f}s" if s.ttft_p50 is not None else "-"
        p95 = f"{s.ttft_p95:.2f}s" if s.ttft_p95 is not None else "-"
        cached, prefilled = c.get("cached_tokens", 0), c.get("prefill_tokens", 0)
        reuse = cached / (cached + prefilled) if cached + prefilled else 0
        queue = "  ".join(f"{q} {n}" for q, n in s.queue.items())
        stats = Table.grid(padding=(0, 2))
        stats.add_row(f"lanes {s.running}/{s.max_lanes}", f"KV {used}/{total} ({100 * used / total:.0f}%)"
                      if total else "KV -", f"queue: {queue}")
        stats.add_row(f"decode {dec[-1] if dec else 0:.1f} tok/s {sparkline(dec)}",
                      f"prefill {pre[-1] if pre else 0:.1f} tok/s", f"TTFT p50 {p50} p95 {p95}")
        stats.add_row(f"prefix reuse {100 * reuse:.0f}% ({cached} tokens)",
                      f"preemptions {c.get('preemptions', 0)}", f"worker restarts {s.restarts}")
        if s.fleet:
            stats.add_row("nodes: " + "  ".join(f"{n.name or n.addr} {'up' if n.up else 'down'} {n.lanes}/"
                                                f"{n.max_lanes} lanes, {n.queue} waiting" for n in s.nodes), "", "")
        cols = ("lane", "class", "phase", "prompt", "generated", "cached") + (("node",) if s.fleet else ())
        lanes = Table(*cols, box=None, padding=(0, 1))
        for x in s.lanes:
            lanes.add_row(str(x.lane), x.qos, PHASES.get(x.phase, x.phase), str(x.prompt), str(x.generated),
                          str(x.cached), *((x.node,) if s.fleet else ()))
        if not s.lanes:
            lanes.add_row("-", "idle", "", "", "", "", *(("",) if s.fleet else ()))
        return Panel(Group(stats, lanes), title=mid, title_align="left")


class LiveMonitor:
    """Runs the dashboard on the terminal while the server runs; `q` returns to plain logs."""

    def __init__(self, dashboard: Dashboard):
        self.dashboard = dashboard
        self._live: Any = None
        self._saved_handlers: list[logging.Handler] = []
        self._term: Any = None
        self._task: Any = None

    def start(self) -> None:
        import asyncio
        import sys

        from rich.console import Console
        from rich.live import Live

        root = logging.getLogger()
        self._saved_handlers = root.handlers[:]
        self.dashboard.logs.setFormatter(OneLine("%(asctime)s %(message)s", "%H:%M:%S"))
        root.handlers = [self.dashboard.logs]
        self._live = Live(self.dashboard.render(), console=Console(), screen=True, refresh_per_second=2)
        self._live.start()
        try:
            import termios
            import tty
            fd = sys.stdin.fileno()
            self._term = (fd, termios.tcgetattr(fd))
            tty.setcbreak(fd)  # keys without Enter; Ctrl-C still signals
            asyncio.get_running_loop().add_reader(fd, self._on_key)
        except (OSError, ValueError, ImportError, AttributeError):
            self._term = None  # no keyboard (stdin is not a terminal): the view stays until exit
        self._task = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        import asyncio
        while self._live is not None:
            self.dashboard.sample()
            self._live.update(self.dashboard.render())
            await asyncio.sleep(1.0)

    def _on_key(self) -> None:
        import os
        assert self._term is not None
        if os.read(self._term[0], 1) in (b"q", b"Q"):
            self.stop()
            logging.getLogger("superfluid").info("monitor closed; plain logs from here (Ctrl-C stops the server)")

    def stop(self) -> None:
        import asyncio
        if self._live is None:
            return
        live, self._live = self._live, None
        live.stop()
        if self._task is not None:
            self._task.cancel()
        if self._term is not None:
            import termios
            fd, attrs = self._term
            try:
                asyncio.get_running_loop().remove_reader(fd)
            except RuntimeError:
                pass
            termios.tcsetattr(fd, termios.TCSADRAIN, attrs)
            self._term = None
        logging.getLogger().handlers = self._saved_handlers
