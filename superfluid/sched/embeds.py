"""Embedding jobs: batches of inputs the scheduler packs into steps beside generations.

An embedding job holds no lane and keeps no KV: each input is pooled whole in one step, in
the runtime's own embedding context. The scheduler gives inputs prefill budget in class
order (Qos.EMBEDDING ranks between agent and background work), so a large indexing job
takes what generations of better classes leave, a step at a time. Inputs are idempotent: a
worker that dies takes nothing with it, the job's unanswered inputs are simply sent again."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..plan import EmbedItem
from ..request import Qos

MAX_LOST = 2  # worker deaths with a job's inputs in flight before the job is given up


@dataclass(frozen=True, slots=True)
class EmbedEvent:
    """One input's result: float32 bytes, or the error that failed the whole job."""
    job_id: str
    index: int  # the input's position in its job
    data: bytes = b""
    error: str = ""
    code: str = ""


@dataclass(eq=False)
class EmbedJob:
    id: str
    items: list[tuple[tuple[int, ...], int]]  # (tokens, pair_at) per input
    qos: Qos = Qos.EMBEDDING
    sent: int = 0  # inputs planned into a step (in order)
    received: int = 0  # inputs whose vectors came back
    order: int = 0
    enqueued_step: int = 0
    lost: int = 0  # times a worker died with inputs of this job in flight

    @property
    def left(self) -> int:
        return len(self.items) - self.sent

    def item(self, key: int) -> EmbedItem:
        tokens, pair_at = self.items[self.sent]
        return EmbedItem(key, tokens, pair_at)


@dataclass
class EmbedQueue:
    """The embedding jobs of one scheduler, and which step carries which of their inputs."""
    window: int = 0  # most tokens in one input (0: the model cannot embed)
    batch: int = 64  # most inputs in one step
    jobs: dict[str, EmbedJob] = field(default_factory=dict)
    inflight: dict[int, dict[int, tuple[EmbedJob, int]]] = field(default_factory=dict)  # step -> key -> job, index
    poisoned: list[str] = field(default_factory=list)  # jobs given up: their inputs kept killing the worker
    _key: int = 0
    _order: int = 0

    def add(self, job: EmbedJob, step: int) -> None:
        if job.id in self.jobs:
            raise ValueError(f"duplicate job {job.id}")
        if not job.items or any(not t for t, _ in job.items):
            raise ValueError("an embedding input is empty")
        if any(len(t) > self.window for t, _ in job.items):
            raise ValueError(f"an embedding input is over the {self.window}-token window")
        self._order += 1
        job.order, job.enqueued_step = self._order, step
        self.jobs[job.id] = job

    def remove(self, job_id: str) -> EmbedJob | None:
        return self.jobs.pop(job_id, None)

    @property
    def has_work(self) -> bool:
        return any(j.left for j in self.jobs.values())

    def ready(self) -> list[EmbedJob]:
        return [j for j in self.jobs.values() if j.left]

    def take(self, job: EmbedJob, budget: int, alone: bool, out: list[EmbedItem], step: int) -> int:
        """Plan the job's next inputs into `out` within `budget` tokens; returns the tokens
        used. An input larger than the whole budget goes only `alone` (the step has no other
        prefill yet), so no input waits forever and no step carries two big ones."""
        used = 0
        planned = self.inflight.setdefault(step, {})
        while job.left and len(out) < self.batch:
            n = len(job.items[job.sent][0])
            if n > budget - used and not (alone and not out and used == 0):
                break
            self._key += 1
            out.append(job.item(self._key))
            planned[self._key] = (job, job.sent)
            job.sent += 1
            used += n
        if not planned:
            self.inflight.pop(step, None)
        return used

    def update(self, step: int, vectors) -> list[EmbedEvent]:
        events: list[EmbedEvent] = []
        for v in vectors:
            job, index = self.inflight.get(step, {}).get(v.key, (None, 0))
            if job is None or self.jobs.get(job.id) is not job:
                continue  # the job ended (cancelled, failed) while the step ran
            job.received += 1
            events.append(EmbedEvent(job.id, index, v.data, v.error, v.code))
            if v.error or job.received == len(job.items):
                self.jobs.pop(job.id, None)
        self.inflight.pop(step, None)
        return events

    def reset(self) -> None:
        """The worker is gone: inputs in flight are planned again (embedding is idempotent),
        unless this job's inputs were in flight at MAX_LOST deaths: then it is given up
        (`poisoned`), so an input that crashes the runtime cannot crash it forever."""
        self.inflight.clear()
        for job in list(self.jobs.values()):
            if job.sent > job.received:
                job.lost += 1
                if job.lost >= MAX_LOST:
                    self.jobs.pop(job.id)
                    self.poisoned.append(job.id)
            job.sent = job.received

    def take_poisoned(self) -> list[str]:
        out, self.poisoned = self.poisoned, []
        return out
