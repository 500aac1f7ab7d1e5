"""How many rows a prefill run has, where that changes the numbers: llama.cpp computes a row
of a one-row run differently from one of a longer run, and splits a batch of several
sequences so that each has as many rows in a micro-batch. With --deterministic (`tail_rows`
2) the scheduler follows these rules so that greedy and seeded output does not depend on
what the cache held, what ran beside it, or whether a restart cut the generation: a row is
computed again as it was first computed, the prompt's in runs of two or more, a decoded
token's (a continued turn's earlier output, prefilled again) in a run of its own."""

from __future__ import annotations

from collections.abc import Iterable

from .jobs import Job, JobStatus


def tail(job: Job, tail_rows: int) -> int:
    """The fewest rows of the prefill run that samples the job's next token: a new turn's
    prompt runs in runs of at least `tail_rows` rows (where it has as many), the one that
    samples included, however much of it a slot or the disk held. A continued turn's next
    token comes from a run of one row, as a decode's does."""
    return 1 if job.output or job.prior else tail_rows


def decoded_from(job: Job) -> int:
    """The position from which the job's known tokens were decoded, one row a run, when
    first computed: its turn's earlier output (`prior`, the end of its prompt) and its own."""
    return len(job.prompt) - len(job.prior)


def cached(job: Job, n: int, tail_rows: int) -> int:
    """How much of a cached prefix of `n` tokens the job keeps: never its last `tail` tokens,
    and with --deterministic never a cut that leaves fewer than `tail_rows` prompt rows
    before its decoded ones (they ran in a longer run when first computed)."""
    n = max(0, min(n, len(job.known()) - tail(job, tail_rows)))
    d = decoded_from(job)
    if tail_rows > 1 and d - tail_rows < n < d:
        n = max(0, d - tail_rows)
    return n


def run(job: Job, room: int, tail_rows: int) -> int:
    """The rows of the job's next prefill run with room for `room` (0: none this step).
    With --deterministic, prompt rows run in runs of at least `tail_rows` that end where its
    decoded tokens begin, never leaving a remainder of one; decoded tokens one row a run."""
    left = job.planned_len - job.scheduled
    if tail_rows < 2 or min(left, room) <= 0:
        return max(0, min(left, room))
    d = decoded_from(job)
    if job.scheduled >= d:
        return 1
    left = min(left, d - job.scheduled)
    n = min(left, room)
    if n < left:
        n = n - 1 if left - n == 1 else n
        if n < tail_rows:
            return 0
    return n


def solo(running: Iterable[Job], step: int, tail_rows: int) -> bool | None:
    """With --deterministic, a prefill run has its step to itself (True; its decodes every
    other step, False), so its rows are cut the same whatever runs beside it. None: no such
    rule (or nothing to prefill)."""
    jobs = list(running)
    if tail_rows < 2 or not any(j.status == JobStatus.PREFILLING for j in jobs):
        return None
    decoding = any(j.status == JobStatus.DECODING for j in jobs)
    return step % 2 == 0 or not decoding
