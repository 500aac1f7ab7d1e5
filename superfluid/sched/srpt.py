"""Shortest remaining work first, within a QoS class (issue 15, item 3).

Most clients never say their class, so a chat lands in the same class as the agents that hold
every lane. As an operating system favours interactive processes, the scheduler then serves
the job with the least work left first:

- **Remaining work** of a job, in tokens: the prompt it has still to prefill (a job never
  admitted counts the prefix a slot held when it was queued as done, `Job.warm`), plus the
  tokens it may still decode: `max_tokens - generated`, but at most DECODE_HORIZON more than
  it has generated so far. max_tokens is often the rest of the window; a job that has already
  generated much is expected to go on (the longest-running are the likeliest long ones).
- **Short**: a job whose prompt still to prefill fits in about one step
  (max(prefill budget, SHORT_MIN) tokens: a chat turn with its template fits).
- A short job that finds every lane busy takes the lane of the running job of its class (or
  a lower one) with the most remaining work, if that is more than its own. The preemption
  is lossless, as a better class's is: the victim's KV stays in its slot, it goes back to the
  front of its queue and continues exactly where it was. Only with a KV slot to spare
  (`--kv-slots` above `--max-batch`, the default): else the newcomer would evict the victim's KV.
- Waiting jobs of one effective class: short ones first, then first come. Prefill chunks of
  one class: least remaining work first.
- No thrash: a job taken this way cannot be taken again by a short job before it has moved
  past where it was (`Job.mark`).
- Aging: `Job.delayed` counts the steps a job was held back by shorter work (waiting after a
  preemption, or a step in which a job admitted after it prefilled while it did not). Once
  it reaches aging_steps the job is never taken by a short job again and prefills in first-
  come order, ahead of shorter jobs. Waiting jobs still rise a class per aging_steps (queues.py).
  A stream of short jobs therefore delays a long one by about 2 x aging_steps at most.

`SUPERFLUID_SRPT=0` in the daemon's environment (a benchmarking switch, read by engine/local.py)
turns all of this off: a class is served first come, first served, and only a better class
preempts."""

from __future__ import annotations

from collections.abc import Iterable

from ..request import Qos
from .jobs import Job, JobStatus

DECODE_HORIZON = 256  # decode tokens expected of a job beyond what it has generated (max_tokens is often huge)
SHORT_MIN = 128  # a prompt this short is "short" even when steps are smaller (a chat turn and its template)


def prefill_left(job: Job) -> int:
    done = job.scheduled if job.cached is not None else max(job.scheduled, job.warm)
    return max(0, job.planned_len - done)


def decode_left(job: Job) -> int:
    return max(0, min(job.max_tokens - job.generated, DECODE_HORIZON + job.generated))


def work(job: Job) -> int:
    """Tokens of work the job has left (see the module's docstring)."""
    return prefill_left(job) + decode_left(job)


def short(job: Job, budget: int) -> bool:
    """Does the job's prompt still to prefill fit in about one step?"""
    return prefill_left(job) <= max(budget, SHORT_MIN)


def progress(job: Job) -> int:
    """How far the job is: prompt tokens sent to the worker, and tokens it generated."""
    return min(job.scheduled, len(job.prompt)) + len(job.output)


def aged(job: Job, aging_steps: int) -> bool:
    """Held back by shorter work long enough: no short job may pass it any more."""
    return job.delayed >= aging_steps


def victim(job: Job, running: Iterable[Job], pinned: set[int], aging_steps: int) -> Job | None:
    """The running job a short `job` may take the lane of: of its class or a lower one, the
    lowest class first, then the most remaining work (which must exceed the job's own), then the
    youngest; never one that is aged, pinned by this plan, or has not moved on since a short
    job last took it."""
    mine = work(job)
    cands = [(j.qos.rank, w, j.admitted, j) for j in running
             if j.qos.rank >= job.qos.rank and j.seq not in pinned and progress(j) > j.mark
             and not aged(j, aging_steps) and (w := work(j)) > mine]
    return max(cands, key=lambda c: c[:3])[3] if cands else None


def preemptee(job: Job, running: Iterable[Job], pinned: set[int], aging_steps: int,
              is_short: bool) -> tuple[Job | None, bool]:
    """(the running job whose lane `job` takes now every lane is busy, or None; whether it is
    taken by a short job). An interactive or completion job takes the lowest class strictly
    below it (decoding before prefilling, youngest first); failing that, a short job takes
    its victim() (which is then not taken again before it moved on)."""
    running = list(running)
    if job.qos.rank <= Qos.COMPLETION:
        below = [j for j in running if j.qos.rank > job.qos.rank and j.seq not in pinned]
        if below:
            return max(below, key=lambda j: (j.qos.rank, j.status == JobStatus.DECODING, j.admitted)), False
    taken = victim(job, running, pinned, aging_steps) if is_short else None
    if taken is not None:
        taken.mark = progress(taken)
    return taken, taken is not None


def prefill_order(job: Job, aging_steps: int) -> tuple[int, int]:
    """Sort key of a prefilling job within its class: aged jobs first (first come among
    them, the caller's tie-break), then least remaining work."""
    return (0, 0) if aged(job, aging_steps) else (1, work(job))


def count_passed(prefilling: list[Job], served: set[int]) -> None:
    """A step's prefill is planned (`served`: the lanes it runs): each prefilling job left
    out while a job of its class admitted after it was served was held back one step."""
    latest: dict[float, int] = {}
    for j in prefilling:
        if j.seq in served:
            latest[j.qos.rank] = max(latest.get(j.qos.rank, 0), j.admitted)
    for j in prefilling:
        if j.seq not in served and latest.get(j.qos.rank, 0) > j.admitted:
            j.delayed += 1
