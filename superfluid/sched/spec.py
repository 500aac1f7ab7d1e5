"""How many draft tokens each decoding lane may have verified in a step (runtime/speculate.py
drafts and verifies them).

A lane gets up to `max_tokens` drafts, scaled by the share of its recent drafts that were
accepted, never more than its request may still produce or its
window hold (counting drafts of steps still in flight), none while an interactive prompt
prefills (verification rows would lengthen the steps a chat waits for), and none for a while
after its drafts were mostly rejected: a lane whose text does not repeat stops paying for
rows it throws away, and tries again later, after a pause that doubles each time it stops
again before its drafts were mostly accepted (free chat: drafts that come and go also cost
llama.cpp a new graph each time, docs/performance.md). A pause is counted in the lane's own
tokens, not in plans: a plan of decodes alone may run several (sched/multistep.py)."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

from .jobs import Job

RATE_KEEP = 0.7  # the acceptance-rate average keeps this much of its past per drafted step
# below this a lane stops drafting ... A verified row costs about half a decoded token on a
# CPU (docs/performance.md, bench/verify_cost.py), so drafts accepted less than about that
# often slow a lane down: measured with suffix drafts (bench/speculative.py), 0.4 made free
# chat 1.01x of no speculation (0.96x at 0.25) and cost agent replay 1% and edit nothing;
# 0.55 cost them 7-9%
RATE_MIN = 0.4
COOLDOWN = 16  # ... for this many of its tokens (a step's, without drafts), then tries again from RATE_RETRY
RATE_RETRY = 0.5
# a lane that stops again waits twice as long as the last time, up to COOLDOWN << DOUBLINGS
# tokens, until its acceptance average reaches RATE_GOOD. Measured with suffix drafts (free
# chat, 36 questions, each on four daemons in turn): 0.947x of no speculation with a fixed
# pause, 0.962x with one doubling, 1.003x with two; agent replay and edit within 2%
DOUBLINGS = 2
RATE_GOOD = 0.8


@dataclass
class _Lane:
    rate: float = 1.0
    off_until: int = 0  # no drafts until the job has generated this many tokens (a plan may decode several)
    stops: int = 0  # times it stopped drafting since its drafts were last mostly accepted


class SpecPolicy:
    def __init__(self, max_tokens: int = 0) -> None:
        self.max_tokens = max_tokens  # a job's default (Job.speculate None); 0: no speculation
        self.supported = True  # does the runtime verify drafts (the engine says after loading)?
        self._lanes: weakref.WeakKeyDictionary[Job, _Lane] = weakref.WeakKeyDictionary()

    def grant(self, job: Job, in_flight: int, n_ctx: int, chat_prefilling: bool) -> int:
        """Drafts for the decode run about to be planned for `job` (its own token comes on
        top); `in_flight`: drafts granted to its runs still in flight."""
        cap = self.max_tokens if job.speculate is None else job.speculate
        if cap <= 0 or not self.supported or chat_prefilling:
            return 0
        lane = self._lanes.get(job)
        if lane is not None and job.generated < lane.off_until:
            return 0
        # as many rows as the lane's recent acceptance pays for: a lane whose drafts are half
        # accepted gets half as many (at least one)
        if lane is not None:
            cap = max(1, math.ceil(cap * lane.rate))
        room = min(job.max_tokens - job.generated, n_ctx - job.planned_len) - 1 - in_flight
        return max(0, min(cap, room))

    def observe(self, job: Job, drafted: int, accepted: int) -> None:
        lane = self._lanes.setdefault(job, _Lane())
        lane.rate = RATE_KEEP * lane.rate + (1 - RATE_KEEP) * accepted / drafted
        if lane.rate >= RATE_GOOD:
            lane.stops = 0
        elif lane.rate < RATE_MIN:
            lane.off_until, lane.rate = job.generated + (COOLDOWN << min(lane.stops, DOUBLINGS)), RATE_RETRY
            lane.stops += 1
