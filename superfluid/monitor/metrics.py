"""Prometheus metrics, named superfluid_*. Engine figures are read at scrape time from each
engine's stats() (engine.contract.EngineStats: no second bookkeeping); time to first token is a
histogram the engine feeds."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine import Hooks

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)

_COUNTERS = (
    ("admissions", "jobs given a lane for the first time"),
    ("cold_admissions", "admissions that reused no KV prefix"),
    ("cached_tokens", "prompt tokens seeded from KV already held (warm prefix), not prefilled"),
    ("preemptions", "lanes taken from a running job (by a better interactive or completion job, or a short job)"),
    ("short_preemptions", "of those, lanes a short job took from one of its class (or lower) with more work left"),
    ("evictions", "prefix-cache entries overwritten"),
    ("prefill_tokens", "prompt tokens sent to the worker to prefill"),
    ("decode_tokens", "tokens decoded"),
    ("coalesced", "admissions seeded by copying a prefix another running lane computed"),
    ("embed_tokens", "tokens of embedding and rerank inputs sent to the worker"),
    ("disk_lookups", "admissions that looked for their prefix in the KV disk tier"),
    ("restores", "admissions whose prefix was restored from the KV disk tier (hit rate: restores / disk_lookups)"),
    ("restored_tokens", "prompt tokens restored from the KV disk tier, not prefilled"),
    ("kv_saves", "lanes' KV written to the disk tier"),
    ("kv_saved_bytes", "bytes of KV written to the disk tier"),
    ("kv_restored_bytes", "bytes of KV read back from the disk tier"),
    ("kv_evicted_bytes", "bytes of KV deleted from the disk tier to stay under --kv-disk-mb"),
    ("draft_tokens", "tokens drafted by speculative decoding and verified (--speculative)"),
    ("draft_accepted_tokens", "drafted tokens that matched the sampled token (acceptance rate: / draft_tokens)"),
)

_NODE_GAUGES = (  # a fleet head's, per node serving the model (labels: its address and name)
    ("up", "1 while the fleet head's link to the node is up"),
    ("lanes_active", "lanes running a job on the node (its last report)"),
    ("queue_depth", "jobs waiting for a lane on the node (its last report)"),
    ("kv_tokens_used", "KV tokens the node holds (its last report)"),
    ("kv_tokens_total", "KV tokens the node's slots can hold (its last report)"),
)


class EngineCollector:
    """Reads each engine's stats() at scrape time. A fleet head's figures are its nodes',
    summed, with a superfluid_node_* series per node."""

    def __init__(self, engines: dict):
        self.engines = engines

    def collect(self):
        lanes = GaugeMetricFamily("superfluid_lanes_active", "lanes running a job", labels=["model"])
        by_class = GaugeMetricFamily("superfluid_lanes_running", "lanes running a job, by class and phase",
                                     labels=["model", "class", "phase"])
        queue = GaugeMetricFamily("superfluid_queue_depth", "jobs waiting for a lane", labels=["model", "class"])
        steps = CounterMetricFamily("superfluid_steps", "scheduler plans run by the worker (a plan of decodes "
                                    "alone may run several forwards: --decode-steps)", labels=["model"])
        respawns = CounterMetricFamily("superfluid_worker_respawns", "worker processes restarted", labels=["model"])
        kv_used = GaugeMetricFamily("superfluid_kv_tokens_used", "KV tokens held (lanes and cache)", labels=["model"])
        kv_total = GaugeMetricFamily("superfluid_kv_tokens_total", "KV tokens the slots can hold", labels=["model"])
        accept = GaugeMetricFamily("superfluid_draft_acceptance_rate",
                                   "drafted tokens accepted / drafted (speculative decoding)", labels=["model"])
        node = {name: GaugeMetricFamily(f"superfluid_node_{name}", doc, labels=["model", "node", "name"])
                for name, doc in _NODE_GAUGES}
        device = GaugeMetricFamily("superfluid_device_memory_bytes", "a GPU's memory (kind total) and what a "
                                   "model's weights and KV take of it (kind model), as fitted at load (docs/gpu.md)",
                                   labels=["model", "device", "kind"])
        fams = {name: CounterMetricFamily(f"superfluid_{name}", doc, labels=["model"]) for name, doc in _COUNTERS}
        for mid, eng in self.engines.items():
            s = eng.stats()
            lanes.add_metric([mid], s.running)
            for (cls, phase), n in sorted(s.by_class_phase().items()):
                by_class.add_metric([mid, cls, phase], n)
            for q, n in s.queue.items():
                queue.add_metric([mid, q], n)
            steps.add_metric([mid], s.steps)
            respawns.add_metric([mid], s.restarts)
            kv_used.add_metric([mid], s.kv_used)
            kv_total.add_metric([mid], s.kv_total)
            for name, _ in _COUNTERS:
                fams[name].add_metric([mid], s.counters.get(name, 0))
            if s.counters.get("draft_tokens"):
                accept.add_metric([mid], s.counters["draft_accepted_tokens"] / s.counters["draft_tokens"])
            if s.device and s.device.get("layers"):
                where = "+".join(s.device["devices"])
                device.add_metric([mid, where, "model"], s.device.get("bytes", 0))
                device.add_metric([mid, where, "total"], s.device.get("total_bytes", 0))
            for n in s.nodes:
                if mid in n.models:
                    label = [mid, n.addr, n.name]
                    node["up"].add_metric(label, int(n.up))
                    node["lanes_active"].add_metric(label, n.lanes if n.up else 0)
                    node["queue_depth"].add_metric(label, n.queue if n.up else 0)
                    node["kv_tokens_used"].add_metric(label, n.kv_used if n.up else 0)
                    node["kv_tokens_total"].add_metric(label, n.kv_total if n.up else 0)
        yield lanes
        yield by_class
        yield queue
        yield steps
        yield respawns
        yield kv_used
        yield kv_total
        yield accept
        yield device
        yield from fams.values()
        yield from node.values()


ITL_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
COMMIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    """The daemon's registry: engine state read at scrape time, plus what the HTTP layer
    and the engines report as it happens."""

    def __init__(self, engines: dict):
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engines))
        self.ttft = Histogram("superfluid_ttft_seconds", "time from request to first token", ["model"],
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("superfluid_inter_token_seconds", "time between a stream's tokens", ["model"],
                             buckets=ITL_BUCKETS, registry=self.registry)
        self.requests = Counter("superfluid_requests", "HTTP requests by path and status",
                                ["path", "status"], registry=self.registry)
        self.errors = Counter("superfluid_errors", "requests that ended in an error, by type",
                              ["type"], registry=self.registry)
        self.pruned = Counter("superfluid_sessions_pruned", "idle sessions erased by retention (age, size cap)",
                              registry=self.registry)
        self.commit = Histogram("superfluid_store_commit_seconds",
                                "session-store transactions (one fsync each; a step's tokens share one)",
                                buckets=COMMIT_BUCKETS, registry=self.registry)

    def hooks(self, model_id: str) -> Hooks:
        """What an engine for `model_id` is built with, to feed its latencies in here."""
        return Hooks(ttft=self.ttft.labels(model_id).observe, itl=self.itl.labels(model_id).observe)

    def observe_request(self, rec: dict) -> None:
        """Called by the access log for every request it logs."""
        status = int(rec.get("status") or 0)
        self.requests.labels(rec.get("route") or "unmatched", str(status)).inc()  # a template: bounded
        if status >= 400:
            self.errors.labels(rec.get("error") or f"http_{status}").inc()

