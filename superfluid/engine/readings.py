"""The JSON readings /health and the web monitor (GET /v1/monitor) give of an engine, both
built from its stats() record (engine.contract.EngineStats) alone. Below api/ in the layers,
beside the contract, so the API layer can use them."""

from __future__ import annotations

from .contract import EngineStats, NodeStats


def node_row(n: NodeStats) -> dict:
    """/health's row for one fleet node: its figures and its last status report as sent."""
    return {"addr": n.addr, "name": n.name, "up": n.up, "lanes": n.lanes if n.up else 0, "max_lanes": n.max_lanes,
            "queue": n.queue if n.up else 0, "kv": {"used": n.kv_used, "total": n.kv_total}, "placed": n.placed,
            "models": list(n.models), "prefixes": n.prefixes, "status": dict(n.report)}


def health_row(s: EngineStats) -> dict:
    """/health's entry for one model. A fleet head's `running` and `waiting` are its nodes'
    lanes and queues, summed; `nodes` has a row per node."""
    out: dict = {"running": s.running, "waiting": s.waiting, "embedding": s.embedding, "lanes": s.max_lanes,
                 "kv_slots": s.kv_slots, "steps": s.steps, "worker_pid": s.worker_pid, "ready": s.ready}
    if s.device is not None:
        out["device"] = dict(s.device)
    if s.fleet:
        out.update(placed=s.placed, nodes=[node_row(n) for n in s.nodes])
    return out


def monitor_record(s: EngineStats) -> dict:
    """The web monitor's reading of one model: lanes by class and phase, queue per class, KV,
    the scheduler's counters, rates, TTFT percentiles, worker restarts (and a fleet head's
    nodes). Rates are also left to the reader: counters are monotonic, as in `superfluid top`."""
    lanes = [{"lane": x.lane, "class": x.qos, "phase": x.phase, "prompt": x.prompt, "generated": x.generated,
              "cached": x.cached, **({"node": x.node} if x.node else {})} for x in s.lanes]
    return {"model": s.model, "status": health_row(s), "lanes": lanes, "max_lanes": s.max_lanes,
            "queue": dict(s.queue), "kv": {"used": s.kv_used, "total": s.kv_total}, "counters": dict(s.counters),
            "rates": {"prefill": s.prefill_rate, "decode": s.decode_rate}, "steps": s.steps,
            "respawns": s.restarts, "ttft": {"n": s.ttft_n, "p50": s.ttft_p50, "p95": s.ttft_p95},
            "stages": list(s.stages)}
