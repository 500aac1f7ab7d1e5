"""Prometheus metrics, named superfluid_*. Scheduler counters are read at scrape time from
the engines (no second bookkeeping); time to first token is a histogram the engine feeds."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)

_COUNTERS = (
    ("admissions", "jobs given a lane for the first time"),
    ("cold_admissions", "admissions that reused no KV prefix"),
    ("cached_tokens", "prompt tokens seeded from KV already held (warm prefix), not prefilled"),
    ("preemptions", "lanes taken from a lower QoS class for an interactive or completion job"),
    ("evictions", "prefix-cache entries overwritten"),
    ("prefill_tokens", "prompt tokens sent to the worker to prefill"),
    ("decode_tokens", "tokens decoded"),
    ("coalesced", "admissions seeded by copying a prefix another running lane computed"),
)


class EngineCollector:
    def __init__(self, engines: dict):
        self.engines = engines

    def collect(self):
        lanes = GaugeMetricFamily("superfluid_lanes_active", "lanes running a job", labels=["model"])
        queue = GaugeMetricFamily("superfluid_queue_depth", "jobs waiting for a lane", labels=["model", "class"])
        steps = CounterMetricFamily("superfluid_steps", "scheduler steps run by the worker", labels=["model"])
        fams = {name: CounterMetricFamily(f"superfluid_{name}", doc, labels=["model"]) for name, doc in _COUNTERS}
        for mid, eng in self.engines.items():
            s = eng.sched
            lanes.add_metric([mid], len(s.running))
            for q, n in s.queue_depth().items():
                queue.add_metric([mid, q.name.lower()], n)
            steps.add_metric([mid], eng.steps)
            for name, _ in _COUNTERS:
                fams[name].add_metric([mid], getattr(s.counters, name))
        yield lanes
        yield queue
        yield steps
        yield from fams.values()


def registry_for(engines: dict) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(EngineCollector(engines))
    ttft = Histogram("superfluid_ttft_seconds", "time from request to first token", ["model"],
                     buckets=TTFT_BUCKETS, registry=reg)
    for mid, eng in engines.items():
        eng.observe_ttft = ttft.labels(mid).observe
    return reg
