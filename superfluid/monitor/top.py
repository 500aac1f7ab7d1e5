"""`superfluid top HOST:PORT ...`: every server's /metrics once a second, a row each (up,
down or 401, lanes, KV use, decode tokens/s, queue, GPU memory) — the fleet at a glance. A fleet head's
row sums its nodes (its /metrics reads the engines' stats()); a row per node follows it,
from the head's superfluid_node_* series."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..api import listener


@dataclass
class Sample:
    state: str  # "up", "down", "401", "not yours" (a loopback listener that is not this user's server)
    t: float
    values: dict[str, float]
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)  # a fleet head's: node -> figures
    # GPU memory (superfluid_device_memory_bytes): device -> [what the models hold there, its total]
    devices: dict[str, list[float]] = field(default_factory=dict)


def scrape(target: str, api_key: str | None, timeout: float = 2.0) -> Sample:
    url = target if "://" in target else f"http://{target}"
    now = time.monotonic()
    local, port = listener.is_loopback_target(url)
    if api_key and local:  # on this machine, the key goes only to this user's own server
        try:
            listener.check(port, timeout)
        except (listener.NoListener, listener.Silent):
            return Sample("down", now, {})
        except listener.NotOurs:
            return Sample("not yours", now, {})
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url.rstrip("/") + "/metrics", headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return Sample("down", now, {})
    if r.status_code in (401, 403):
        return Sample(str(r.status_code), now, {})
    if r.status_code != 200:
        return Sample(f"http {r.status_code}", now, {})
    return Sample("up", now, *parse(r.text))


def parse(text: str) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, list[float]]]:
    """A /metrics page's figures: (values summed over labels, a fleet head's per node, GPU memory per device)."""
    values: dict[str, float] = {}
    nodes: dict[str, dict[str, float]] = {}
    devices: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value  # summed over models and classes
            if s.name == "superfluid_device_memory_bytes":
                held = devices.setdefault(s.labels.get("device", "?"), [0.0, 0.0])
                if s.labels.get("kind") == "total":  # each model on the device says its size
                    held[1] = max(held[1], s.value)
                else:
                    held[0] += s.value
            if s.name.startswith("superfluid_node_") and "node" in s.labels:
                fig = nodes.setdefault(s.labels["node"], {})
                fig[s.name] = fig.get(s.name, 0.0) + s.value  # summed over the models it serves
    return values, nodes, devices


def gpu(devices: dict[str, list[float]]) -> str:
    """What the models hold of each GPU's memory ("-": everything on the CPU)."""
    return ", ".join(f"{d} {held / 2**30:.1f}/{total / 2**30:.1f} GiB"
                     for d, (held, total) in sorted(devices.items())) or "-"


def row(target: str, cur: Sample, prev: Sample | None) -> list[str]:
    if cur.state != "up":
        return [target, cur.state, "-", "-", "-", "-", "-", "-"]
    v = cur.values
    rate = "-"
    if prev is not None and prev.state == "up" and cur.t > prev.t:
        d = v.get("superfluid_decode_tokens_total", 0) - prev.values.get("superfluid_decode_tokens_total", 0)
        rate = f"{max(0.0, d) / (cur.t - prev.t):.1f}"
    total = v.get("superfluid_kv_tokens_total", 0)
    kv = f"{100 * v.get('superfluid_kv_tokens_used', 0) / total:.0f}%" if total else "-"
    return [target, "up", f"{v.get('superfluid_lanes_active', 0):.0f}", kv, rate,
            f"{v.get('superfluid_queue_depth', 0):.0f}", f"{v.get('superfluid_preemptions_total', 0):.0f}",
            gpu(cur.devices)]


def node_rows(cur: Sample) -> list[list[str]]:
    """A fleet head's nodes, a row each under the head's own."""
    out = []
    for node, v in sorted(cur.nodes.items()):
        if not v.get("superfluid_node_up", 0):
            out.append([f"  └ {node}", "down", "-", "-", "-", "-", "-", "-"])
            continue
        total = v.get("superfluid_node_kv_tokens_total", 0)
        kv = f"{100 * v.get('superfluid_node_kv_tokens_used', 0) / total:.0f}%" if total else "-"
        out.append([f"  └ {node}", "up", f"{v.get('superfluid_node_lanes_active', 0):.0f}", kv, "-",
                    f"{v.get('superfluid_node_queue_depth', 0):.0f}", "-", "-"])
    return out


def rows_for(target: str, cur: Sample, prev: Sample | None) -> list[list[str]]:
    return [row(target, cur, prev), *node_rows(cur)]


def table(rows: list[list[str]]) -> Table:
    t = Table(title="superfluid top")
    for col in ("server", "state", "lanes", "KV", "decode tok/s", "queue", "preemptions", "GPU memory"):
        t.add_column(col, justify="left" if col in ("server", "state") else "right")
    for r in rows:
        t.add_row(*r)
    return t


def run(targets: list[str], *, api_key: str | None = None, interval: float = 1.0, once: bool = False,
        console: Console | None = None) -> None:
    console = console or Console()
    prev = {t: scrape(t, api_key) for t in targets}
    if once:
        time.sleep(interval)
        console.print(table([r for t in targets for r in rows_for(t, scrape(t, api_key), prev[t])]))
        return
    with Live(table([r for t in targets for r in rows_for(t, prev[t], None)]), console=console,
              refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            cur = {t: scrape(t, api_key) for t in targets}
            live.update(table([r for t in targets for r in rows_for(t, cur[t], prev[t])]))
            prev = cur
