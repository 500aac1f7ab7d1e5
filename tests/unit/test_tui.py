"""The live monitor renders a frame with the key figures (fixed size, no terminal)."""

import io
import logging
from collections import deque
from types import SimpleNamespace

from rich.console import Console

from superfluid.engine.stats import RateMeter, local_stats
from superfluid.monitor.tui import Dashboard, LogBuffer, sparkline
from superfluid.request import Qos, SamplingParams
from superfluid.sched.scheduler import Job, Scheduler


class EngineView:
    """The engine's parts the local stats() reads: a real scheduler, no worker."""

    def __init__(self):
        self.model_id = "SmolLM2"
        self.cfg = SimpleNamespace(slots=8, stages=())
        self.sched = Scheduler(lanes=4, n_ctx=512, step_tokens=64, eog=frozenset({0}), slots=8)
        self.respawns = 2
        self.steps = 0
        self.ready = True
        self.worker = None
        self.meter = RateMeter()
        self.recent_ttft = deque([0.2, 0.4, 0.6, 3.0])

    def kv_usage(self):
        return 300, 4096

    def stats(self):
        return local_stats(self)


def frame(d: Dashboard) -> str:
    con = Console(file=io.StringIO(), width=130, height=50, record=True)
    con.print(d.render())
    return con.export_text()


def test_dashboard_frame_shows_the_key_figures():
    eng = EngineView()
    eng.sched.add(Job("a", list(range(10, 40)), SamplingParams(), 5, Qos.BACKGROUND))
    eng.sched.add(Job("b", list(range(50, 60)), SamplingParams(), 5, Qos.INTERACTIVE))
    for i in range(5):
        eng.sched.add(Job(f"w{i}", [1000 + i] * 3, SamplingParams(), 5, Qos.AGENT))
    eng.sched.schedule()
    eng.sched.counters.preemptions = 3
    logs = LogBuffer()
    logs.setFormatter(logging.Formatter("%(message)s"))
    logs.emit(logging.LogRecord("x", logging.WARNING, "", 0, "worker respawned (pid 42)", None, None))
    t = [100.0]
    d = Dashboard({"SmolLM2": eng}, "http://127.0.0.1:8453", logs, clock=lambda: t[0])
    d.sample()
    eng.sched.counters.decode_tokens += 50
    t[0] += 1.0
    d.sample()
    out = frame(d)
    for needle in ("SmolLM2", "lanes 4/4", "KV 300/4096 (7%)", "agent 2", "decode 50.0 tok/s",
                   "TTFT p50 0.50s p95 3.00s", "preemptions 3", "worker restarts 2", "interactive",
                   "background", "prefill", "worker respawned (pid 42)", "http://127.0.0.1:8453"):
        assert needle in out, needle


def test_sparkline():
    assert sparkline([]) == ""
    assert sparkline([0, 5, 10]) == "▁▄█"
    assert len(sparkline(list(range(100)), width=30)) == 30
