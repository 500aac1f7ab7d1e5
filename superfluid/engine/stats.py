"""The local engine's stats() record (engine.contract.EngineStats), read from its scheduler and
worker, and the rate meter that turns monotonic token counters into tokens per second."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import TYPE_CHECKING

from .contract import EngineStats, Lane, full_queue, percentiles

if TYPE_CHECKING:
    from .local import Engine


class RateMeter:
    """Tokens per second over about the last `window` seconds, from counter readings taken
    when someone asks (no clock in the engine loop): a reading is kept at most every
    `every` seconds; the rate is measured against the newest one at least `window` old
    (or the oldest kept)."""

    def __init__(self, window: float = 3.0, every: float = 0.25, clock=time.monotonic):
        self.window, self.every, self.clock = window, every, clock
        self._kept: deque[tuple[float, tuple[int, ...]]] = deque(maxlen=int(4 * window / every) + 2)

    def rates(self, values: tuple[int, ...]) -> tuple[float, ...]:
        now = self.clock()
        base = None
        for t, v in self._kept:
            if base is None or now - t >= self.window:
                base = (t, v)
        if not self._kept or now - self._kept[-1][0] >= self.every:
            self._kept.append((now, values))
        while len(self._kept) > 1 and now - self._kept[1][0] >= self.window:
            self._kept.popleft()  # the newest reading at least `window` old stays as the next base
        if base is None or now <= base[0]:
            return tuple(0.0 for _ in values)
        dt = now - base[0]
        return tuple(max(0.0, (a - b) / dt) for a, b in zip(values, base[1], strict=True))


def local_stats(eng: Engine) -> EngineStats:
    s = eng.sched
    c = s.counters
    used, total = eng.kv_usage()
    prefill, decode = eng.meter.rates((c.prefill_tokens, c.decode_tokens))
    p50, p95 = percentiles(eng.recent_ttft)
    lanes = tuple(Lane(seq, job.qos.name.lower(), job.status.name.lower(), len(job.prompt), len(job.output),
                       job.cached or 0) for seq, job in sorted(s.running.items()))
    return EngineStats(
        model=eng.model_id, ready=eng.ready, max_lanes=s.max_lanes, lanes=lanes,
        queue=full_queue({q.name.lower(): n for q, n in s.queue_depth().items()}),
        kv_used=used, kv_total=total, kv_slots=eng.cfg.slots, prefill_rate=prefill, decode_rate=decode,
        ttft_n=len(eng.recent_ttft), ttft_p50=p50, ttft_p95=p95, restarts=eng.respawns, steps=eng.steps,
        embedding=len(s.embeds.jobs), counters=dataclasses.asdict(c),
        worker_pid=eng.worker.pid if eng.worker else None,
        device=eng.offload.to_json() if getattr(eng, "offload", None) is not None else None,
        stages=tuple(f"{h}:{p}" for h, p in eng.cfg.stages))
