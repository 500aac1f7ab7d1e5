"""Waiting jobs, in the order they should get a lane: best effective class first, then
first come (a preempted job goes back to the front of its class). A job's effective class
rises one step every `aging_steps` scheduler steps it waits, so background work never
starves behind a steady stream of better classes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..request import Qos


class Waiter(Protocol):
    id: str
    qos: Qos
    enqueued_step: int
    order: int


class WaitQueue:
    def __init__(self, aging_steps: int = 256):
        if aging_steps < 1:
            raise ValueError("aging_steps must be at least 1")
        self.aging_steps = aging_steps
        self._jobs: dict[str, Waiter] = {}
        self._back = 0
        self._front = 0

    def push(self, job: Waiter, step: int) -> None:
        self._back += 1
        job.order, job.enqueued_step = self._back, step
        self._jobs[job.id] = job

    def push_front(self, job: Waiter, step: int) -> None:
        """Back to the head of its class (a preempted job): ahead of every job queued the
        normal way, and it keeps no aging credit it had."""
        self._front -= 1
        job.order, job.enqueued_step = self._front, step
        self._jobs[job.id] = job

    def remove(self, job_id: str) -> Waiter | None:
        return self._jobs.pop(job_id, None)

    def effective(self, job: Waiter, step: int) -> float:
        return max(0.0, job.qos.rank - (step - job.enqueued_step) // self.aging_steps)

    def ordered(self, step: int, first: Callable[[Any], bool] | None = None) -> list:
        """Waiting jobs in admission order; within an effective class, jobs for which
        `first` holds (short ones, sched/srpt.py) go before the others."""
        if first is None:
            return sorted(self._jobs.values(), key=lambda j: (self.effective(j, step), j.order))
        return sorted(self._jobs.values(), key=lambda j: (self.effective(j, step), not first(j), j.order))

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator:
        return iter(list(self._jobs.values()))

    def count(self, qos: Qos) -> int:
        return sum(1 for j in self._jobs.values() if j.qos == qos)
