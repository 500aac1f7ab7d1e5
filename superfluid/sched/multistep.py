"""Multi-step decode: how many forwards one plan may run for lanes that only decode
(Run.more; the runtime decodes each lane's own samples again, runtime/base.py).

A plan's round trip costs the daemon's API process the same work whatever it carries
(receiving the result, the scheduler's update and next plan, the frames), and on a machine
whose cores all run the decode that work is taken from the decode: a single stream on two
cores spent 0.6 ms of it per token, 6% of a token (docs/performance.md). A plan of several
decode steps pays it once. It is given only where nothing else could use the step: every
run is a decode (no prompt prefills; a lane whose drafter proposes drafts verifies them in
the first forward and runs no more), no job or embedding input waits for a lane, the rows
need not be deterministic (--deterministic keeps its own row rules), and the runtime places
decodes at the lane's end (ModelInfo.speculate: a plan in flight may not know where an
earlier one left a lane). The engine sizes `steps` from the measured decode step so that a
plan takes about DECODE_PLAN_S: a request that arrives waits for the plans in flight
before its own."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from ..plan import Run
from .jobs import Job


def extend(runs: list[Run], running: dict[int, Job], steps: int, n_ctx: int,
           in_flight: Callable[[Job], int]) -> list[Run]:
    """The runs, each decode given up to `steps - 1` more forwards (never past what its
    request may still produce or its window hold, counting its drafts and the extra tokens of
    its runs still in flight), when every run is a decode. A run granted drafts uses them
    only where its drafter proposes none (runtime/base.py): a plan's drafts are verified in
    its first forward alone, so the speculation policy hears of them as soon as before."""
    if steps <= 1 or not decodes_only(runs):
        return runs
    out = []
    for r in runs:
        job = running[r.seq]
        room = min(job.max_tokens - job.generated, n_ctx - job.planned_len) - in_flight(job) - r.draft
        out.append(replace(r, more=max(0, min(steps - 1, room))))
    return out


def decodes_only(runs: Iterable[Run]) -> bool:
    """Is every run a decode (one token, sampled; drafts granted or not)?"""
    runs = list(runs)
    return bool(runs) and all(r.sample and len(r.tokens) == 1 for r in runs)


def forwards(runs: Iterable[Run], sampled_seqs: Iterable[int], drafted: bool) -> int:
    """Forwards a plan of decodes ran when none verified drafts: the most samples any lane got
    (0 for another plan)."""
    if drafted or not decodes_only(runs):
        return 0
    counts: dict[int, int] = {}
    for q in sampled_seqs:
        counts[q] = counts.get(q, 0) + 1
    return max(counts.values(), default=0)
