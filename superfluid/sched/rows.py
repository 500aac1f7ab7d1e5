"""How many rows a prefill run has, where that changes the numbers: llama.cpp computes a row
of a one-row run differently from one of a longer run, and splits a batch of several
sequences so that each has as many rows in a micro-batch. With --deterministic (`tail_rows`
2) the scheduler follows these rules so that greedy and seeded output does not depend on
what the cache held or what ran beside it."""

from __future__ import annotations

from collections.abc import Iterable

from .jobs import Job, JobStatus


def tail(job: Job, tail_rows: int) -> int:
    """The fewest rows of the prefill run that samples the job's next token: a new turn's
    prompt runs in runs of at least `tail_rows` rows (where it has as many), the one that
    samples included, however much of it a slot or the disk held. A continued turn's next
    token comes from a run of one row, as a decode's does."""
    return 1 if job.output or job.prior else tail_rows


def solo(running: Iterable[Job], step: int, tail_rows: int) -> bool | None:
    """With --deterministic, a prefill run has its step to itself (True; its decodes every
    other step, False), so its rows are cut the same whatever runs beside it. None: no such
    rule (or nothing to prefill)."""
    jobs = list(running)
    if tail_rows < 2 or not any(j.status == JobStatus.PREFILLING for j in jobs):
        return None
    decoding = any(j.status == JobStatus.DECODING for j in jobs)
    return step % 2 == 0 or not decoding
