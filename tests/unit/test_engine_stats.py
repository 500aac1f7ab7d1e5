"""The engine contract's stats() record: the local engine's from its scheduler, a fleet
head's summed from its nodes' NODE_STATUS (old nodes' reports included), and what /health,
/metrics, the web monitor and `superfluid top` make of it. No model, no processes."""

from collections import deque
from types import SimpleNamespace as NS

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from superfluid.engine.local import Engine
from superfluid.engine.contract import QUEUE_CLASSES, EngineAPI, percentiles
from superfluid.engine.stats import RateMeter, local_stats
from superfluid.fleet.head import FleetEngine
from superfluid.fleet.pool import NodeConn
from superfluid.link.messages import ModelOffer
from superfluid.fleet.stats import fleet_stats, node_status
from superfluid.monitor.metrics import EngineCollector
from superfluid.engine.readings import health_row, monitor_record
from superfluid.monitor.top import Sample, node_rows
from superfluid.request import Qos, SamplingParams
from superfluid.sched.scheduler import Job, Scheduler


class LocalView:
    """The parts of a local Engine that its stats() reads: a real scheduler, no worker."""

    def __init__(self, lanes: int = 2):
        self.model_id = "m"
        self.cfg = NS(slots=4, stages=(("10.0.0.2", 8454),))
        self.sched = Scheduler(lanes=lanes, n_ctx=512, step_tokens=64, eog=frozenset({0}), slots=4)
        self.respawns, self.steps, self.ready, self.worker = 1, 7, True, NS(pid=4242)
        self.t = [0.0]
        self.meter = RateMeter(clock=lambda: self.t[0])
        self.recent_ttft = deque([0.1, 0.3, 0.2])

    def kv_usage(self):
        return 100, 2048

    def stats(self):
        return local_stats(self)


def busy() -> LocalView:
    eng = LocalView()
    eng.sched.add(Job("a", list(range(10, 40)), SamplingParams(), 5, Qos.INTERACTIVE))
    eng.sched.add(Job("b", list(range(50, 60)), SamplingParams(), 5, Qos.BACKGROUND))
    for i in range(3):
        eng.sched.add(Job(f"w{i}", [1000 + i] * 3, SamplingParams(), 5, Qos.AGENT))
    eng.sched.schedule()
    return eng


def test_local_stats_read_lanes_by_class_and_phase_queue_kv_ttft_and_restarts():
    s = busy().stats()
    assert s.model == "m" and s.ready and s.max_lanes == 2 and s.running == 2
    assert s.by_class_phase() == {("interactive", "decoding"): 1, ("agent", "prefilling"): 1}
    assert list(s.queue) == list(QUEUE_CLASSES) and (s.queue["agent"], s.queue["background"]) == (2, 1)
    assert s.waiting == 3
    assert (s.kv_used, s.kv_total, s.kv_slots) == (100, 2048, 4)
    assert (s.ttft_n, s.ttft_p50, s.ttft_p95) == (3, 0.2, 0.3)
    assert (s.restarts, s.steps, s.worker_pid, s.stages) == (1, 7, 4242, ("10.0.0.2:8454",))
    assert s.counters["admissions"] == 2 and not s.fleet and s.nodes == ()


def test_rates_are_tokens_per_second_over_the_last_seconds():
    eng = busy()
    assert eng.stats().decode_rate == 0.0  # one reading: no rate yet
    eng.t[0] = 1.0
    eng.sched.counters.decode_tokens += 50
    eng.sched.counters.prefill_tokens += 200
    s = eng.stats()
    assert (s.decode_rate, s.prefill_rate) == (50.0, 200.0)
    eng.t[0] = 10.0  # idle since: the rate falls to nothing
    assert eng.stats().decode_rate == 0.0


def test_percentiles():
    assert percentiles([]) == (None, None)
    assert percentiles([0.2, 0.4, 0.6, 3.0]) == (0.5, 3.0)


def node(host: str, port: int, report: dict, *, up: bool = True, model: str = "m", name: str = "") -> NodeConn:
    n = NodeConn(host, port, up=up, name=name or host, models=[ModelOffer(model, 512)])
    n.status = report
    return n


def fleet_view(nodes: list[NodeConn]) -> NS:
    return NS(model_id="m", nodes=nodes, ready=True, recent_ttft=deque([0.5]), embedder=NS(running=0),
              placed=3, placed_on=lambda n: 2 if n is nodes[0] else 1)


def test_a_fleet_heads_stats_sum_its_nodes_with_a_row_each():
    a = busy()
    a.sched.counters.decode_tokens = 40
    b = LocalView()
    b.sched.add(Job("x", [5, 6, 7], SamplingParams(), 5, Qos.COMPLETION))
    b.sched.schedule()
    b.sched.counters.decode_tokens = 2
    old = {"lanes": 8, "running": 2, "waiting": 1, "kv_used": 10, "kv_total": 100}  # a node that predates lane_list
    down = node("10.0.0.4", 8454, node_status(a.stats()), up=False)
    other = node("10.0.0.5", 8454, node_status(a.stats()), model="other")
    nodes = [node("10.0.0.1", 8454, node_status(a.stats()), name="a"), node("10.0.0.2", 8454, node_status(b.stats())),
             node("10.0.0.3", 8454, old), down, other]
    s = fleet_stats(fleet_view(nodes))
    assert s.fleet and s.ready and s.placed == 3
    assert s.running == 2 + 1 + 2  # the up nodes serving the model
    assert s.by_class_phase() == {("interactive", "decoding"): 1, ("agent", "prefilling"): 1,
                                  ("completion", "decoding"): 1, ("unknown", "unknown"): 2}
    assert {x.node for x in s.lanes} == {"a", "10.0.0.2", "10.0.0.3"}
    assert (s.queue["agent"], s.queue["background"], s.queue["unknown"], s.waiting) == (2, 1, 1, 4)
    assert (s.max_lanes, s.kv_used, s.kv_total) == (2 + 2 + 8, 100 + 100 + 10, 2048 + 2048 + 100)
    assert s.counters["decode_tokens"] == 40 + 2 + 40  # a down node's last report still counts
    assert s.restarts == 3 and s.ttft_p50 == 0.5
    assert [(r.addr, r.up, r.lanes, r.queue, r.placed) for r in s.nodes] == [
        ("10.0.0.1:8454", True, 2, 3, 2), ("10.0.0.2:8454", True, 1, 0, 1), ("10.0.0.3:8454", True, 2, 1, 1),
        ("10.0.0.4:8454", False, 2, 3, 1), ("10.0.0.5:8454", True, 2, 3, 1)]


def test_health_and_monitor_records_come_from_stats():
    local = health_row(busy().stats())
    assert local == {"running": 2, "waiting": 3, "embedding": 0, "lanes": 2, "kv_slots": 4, "steps": 7,
                     "worker_pid": 4242, "ready": True}
    a = busy()
    nodes = [node("10.0.0.1", 8454, node_status(a.stats())), node("10.0.0.2", 8454, {}, up=False)]
    h = health_row(fleet_stats(fleet_view(nodes)))
    assert h["running"] == 2 and h["waiting"] == 3 and h["placed"] == 3
    assert [(n["addr"], n["up"], n["lanes"], n["queue"], n["placed"]) for n in h["nodes"]] == [
        ("10.0.0.1:8454", True, 2, 3, 2), ("10.0.0.2:8454", False, 0, 0, 1)]
    assert h["nodes"][0]["status"]["running"] == 2 and h["nodes"][0]["kv"] == {"used": 100, "total": 2048}
    assert "nodes" in health_row(fleet_stats(fleet_view([])))  # a head no node has joined yet
    rec = monitor_record(busy().stats())
    assert [(x["class"], x["phase"]) for x in rec["lanes"]] == [("interactive", "decoding"), ("agent", "prefilling")]
    assert rec["queue"]["agent"] == 2 and rec["respawns"] == 1 and rec["ttft"]["p50"] == 0.2
    assert rec["stages"] == ["10.0.0.2:8454"] and rec["counters"]["admissions"] == 2


def test_a_nodes_status_changes_with_its_engine_and_only_then():
    """A node sends NODE_STATUS when it changes (fleet/node.py): never for an idle engine."""
    eng = LocalView()
    idle = node_status(eng.stats())
    assert node_status(eng.stats()) == idle
    eng.sched.add(Job("a", [5, 6, 7], SamplingParams(), 5, Qos.AGENT))
    queued = node_status(eng.stats())
    assert queued != idle and queued["queue"] == {"agent": 1} and queued["waiting"] == 1
    eng.sched.schedule()
    running = node_status(eng.stats())
    assert running["lane_list"] == [[0, "agent", "decoding", 3, 0, 0]] and running["running"] == 1
    eng.sched.counters.decode_tokens += 9
    assert node_status(eng.stats())["counters"]["decode_tokens"] == 9


def metrics_of(engines: dict) -> dict:
    reg = CollectorRegistry()
    reg.register(EngineCollector(engines))
    text = generate_latest(reg).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_show_a_fleet_heads_node_lanes_and_top_shows_a_row_per_node():
    a = busy()
    nodes = [node("10.0.0.1", 8454, node_status(a.stats()), name="a"), node("10.0.0.2", 8454, {}, up=False, name="b")]
    head = fleet_view(nodes)
    head.stats = lambda: fleet_stats(head)
    m = metrics_of({"m": head, "local": busy()})
    assert m[("superfluid_lanes_active", (("model", "m"),))] == 2
    assert m[("superfluid_lanes_running", (("class", "interactive"), ("model", "m"), ("phase", "decoding")))] == 1
    assert m[("superfluid_queue_depth", (("class", "agent"), ("model", "m")))] == 2
    assert m[("superfluid_node_lanes_active", (("model", "m"), ("name", "a"), ("node", "10.0.0.1:8454")))] == 2
    assert m[("superfluid_node_up", (("model", "m"), ("name", "b"), ("node", "10.0.0.2:8454")))] == 0
    assert m[("superfluid_lanes_active", (("model", "local"),))] == 2
    assert not [k for k in m if k[0].startswith("superfluid_node_") and ("model", "local") in k[1]]
    nodes_seen: dict = {}
    for (name, labels), v in m.items():
        if name.startswith("superfluid_node_"):
            nodes_seen.setdefault(dict(labels)["node"], {})[name] = v
    rows = node_rows(Sample("up", 0.0, {}, nodes_seen))
    assert rows[0][:3] == ["  └ 10.0.0.1:8454", "up", "2"] and rows[0][5] == "3"
    assert rows[1][:2] == ["  └ 10.0.0.2:8454", "down"]


def test_both_engines_meet_the_contract_and_neither_inherits_from_the_other():
    assert not issubclass(FleetEngine, Engine) and not issubclass(Engine, FleetEngine)
    members = [k for k in EngineAPI.__dict__ if not k.startswith("_")] + list(EngineAPI.__annotations__)
    assert {"submit", "cancel", "stats", "n_ctx", "model_kind"} <= set(members)
    instance_attrs = {"model_id", "cfg", "tokenizer", "template", "tool_format", "reasoning", "info", "last_used",
                      "sampling_defaults"}
    for cls in (Engine, FleetEngine):
        missing = [k for k in members if k not in instance_attrs and not hasattr(cls, k)]
        assert not missing, (cls, missing)
