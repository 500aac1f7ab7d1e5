"""A fleet's stats: what a node reports of its engine in NODE_STATUS, and the head's
stats() record built from those reports (engine.contract.EngineStats with a row per node).

NODE_STATUS (the record link/messages.NodeStatus: a field added here is added there too)
always carries {lanes (the node's lane count), running, waiting, kv_used, kv_total}. These
are optional, each (a head that does not know one ignores it; a node that does not send them
shows as lanes of unknown class and phase):
`lane_list` [[lane, class, phase, prompt, generated, cached]...], `queue` {class: waiting}
(classes with none waiting left out), `counters` {scheduler counter: value}, `rates`
[prefill tokens/s, decode tokens/s], `restarts`, `steps`, `kv_slots` and `device` (where the
model's layers are: runtime/offload.Offload.to_json, which placement prefers on a tie).

The head sums, over the nodes serving the model that are up: lanes, queue, KV and rates;
counters, restarts and steps are summed over every node that serves the model, up or not
(a node's last report stands while it is away, so the sums never step back)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ..engine.contract import EngineStats, Lane, NodeStats, full_queue, percentiles

if TYPE_CHECKING:
    from .head import FleetEngine


def node_status(s: EngineStats) -> dict:
    """A node's NODE_STATUS body from its engine's stats()."""
    return {"lanes": s.max_lanes, "running": s.running, "waiting": s.waiting, "kv_used": s.kv_used,
            "kv_total": s.kv_total, "kv_slots": s.kv_slots,
            "lane_list": [[x.lane, x.qos, x.phase, x.prompt, x.generated, x.cached] for x in s.lanes],
            "queue": {q: n for q, n in s.queue.items() if n}, "counters": dict(s.counters),
            "rates": [round(s.prefill_rate, 2), round(s.decode_rate, 2)], "restarts": s.restarts, "steps": s.steps,
            **({"device": dict(s.device)} if s.device else {})}


def _int(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


def node_lanes(report: dict, node: str) -> list[Lane]:
    """The running lanes a node reported (`running` lanes of unknown class when it sends no lane list)."""
    raw = report.get("lane_list")
    if not isinstance(raw, list):
        return [Lane(i, "unknown", "unknown", node=node) for i in range(_int(report.get("running")))]
    out = []
    for x in raw:
        if isinstance(x, (list, tuple)) and len(x) >= 6:
            out.append(Lane(_int(x[0]), str(x[1]), str(x[2]), _int(x[3]), _int(x[4]), _int(x[5]), node=node))
    return out


def node_queue(report: dict) -> dict[str, int]:
    """Generations waiting on a node, by class (all of them `unknown` when it sends no breakdown)."""
    raw = report.get("queue")
    if isinstance(raw, dict):
        return {str(q): _int(n) for q, n in raw.items()}
    waiting = _int(report.get("waiting"))
    return {"unknown": waiting} if waiting else {}


def fleet_stats(eng: FleetEngine) -> EngineStats:
    rows: list[NodeStats] = []
    lanes: list[Lane] = []
    queue: Counter[str] = Counter()
    counters: Counter[str] = Counter()
    kv_used = kv_total = kv_slots = max_lanes = restarts = steps = 0
    prefill = decode = 0.0
    for n in eng.nodes:
        rep = n.status if isinstance(n.status, dict) else {}
        mine, q = node_lanes(rep, n.name or n.addr), node_queue(rep)
        rows.append(NodeStats(name=n.name, addr=n.addr, up=n.up, lanes=len(mine), max_lanes=_int(rep.get("lanes")),
                              queue=sum(q.values()), kv_used=_int(rep.get("kv_used")),
                              kv_total=_int(rep.get("kv_total")), placed=eng.placed_on(n),
                              models=tuple(x.id for x in n.models), prefixes=len(n.prefixes),
                              report=dict(rep)))
        if not n.serves(eng.model_id):
            continue
        if isinstance(rep.get("counters"), dict):
            counters.update({str(k): _int(v) for k, v in rep["counters"].items()})
        restarts += _int(rep.get("restarts"))
        steps += _int(rep.get("steps"))
        if not n.up:
            continue
        lanes += mine
        queue.update(q)
        kv_used, kv_total = kv_used + rows[-1].kv_used, kv_total + rows[-1].kv_total
        kv_slots += _int(rep.get("kv_slots"))
        max_lanes += rows[-1].max_lanes
        rates = rep.get("rates")
        if isinstance(rates, list) and len(rates) == 2:
            prefill, decode = prefill + _float(rates[0]), decode + _float(rates[1])
    p50, p95 = percentiles(eng.recent_ttft)
    return EngineStats(
        model=eng.model_id, ready=eng.ready, max_lanes=max_lanes, lanes=tuple(lanes), queue=full_queue(queue),
        kv_used=kv_used, kv_total=kv_total, kv_slots=kv_slots, prefill_rate=prefill, decode_rate=decode,
        ttft_n=len(eng.recent_ttft), ttft_p50=p50, ttft_p95=p95, restarts=restarts, steps=steps,
        embedding=eng.embedder.running, counters=dict(counters), fleet=True, nodes=tuple(rows),
        placed=eng.placed)
