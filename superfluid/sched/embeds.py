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
MIN_CHUNK = 16  # a smaller piece of an input waits for the next step (unless the step has nothing else)
MAX_PARTIAL = 8  # inputs half-sent (chunked) at once: each holds a sequence of the runtime's embedding context


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
    cursor: int = 0  # tokens of input `sent` already sent in chunks (chunked models)
    key: int = 0  # the runtime's key of the input being chunked

    @property
    def left(self) -> int:
        return len(self.items) - self.sent



@dataclass
class EmbedQueue:
    """The embedding jobs of one scheduler, and which step carries which of their inputs."""
    window: int = 0  # most tokens in one input (0: the model cannot embed)
    batch: int = 64  # most inputs in one step
    chunks: bool = False  # the runtime takes an input in chunks over several steps (causal models)
    jobs: dict[str, EmbedJob] = field(default_factory=dict)
    inflight: dict[int, dict[int, tuple[EmbedJob, int]]] = field(default_factory=dict)  # step -> key -> job, index
    poisoned: list[str] = field(default_factory=list)  # jobs given up: their inputs kept killing the worker
    drops: list[int] = field(default_factory=list)  # keys of cancelled half-sent inputs: the runtime frees them
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
        job = self.jobs.pop(job_id, None)
        if job is not None and job.cursor:
            self.drops.append(job.key)
        return job

    def take_drops(self, out: list[EmbedItem]) -> None:
        out.extend(EmbedItem(k, ()) for k in self.drops)
        self.drops.clear()

    @property
    def partial(self) -> int:
        return sum(1 for j in self.jobs.values() if j.cursor)

    @property
    def has_work(self) -> bool:
        return bool(self.drops) or any(j.left for j in self.jobs.values())

    def ready(self) -> list[EmbedJob]:
        return [j for j in self.jobs.values() if j.left]

    def take(self, job: EmbedJob, budget: int, alone: bool, out: list[EmbedItem], step: int) -> int:
        """Plan the job's next inputs into `out` within `budget` tokens; returns the tokens
        used. With `chunks`, an input that does not fit is cut: what fits now, the rest in
        the next steps (at most MAX_PARTIAL inputs half-sent at once). Without, an input larger
        than the whole budget goes only `alone` (the step has no other prefill yet), so no
        input waits forever and no step carries two big ones."""
        used = 0
        planned = self.inflight.setdefault(step, {})
        while job.left and sum(1 for e in out if e.tokens) < self.batch:
            tokens, pair_at = job.items[job.sent]
            rest, room = len(tokens) - job.cursor, budget - used
            if job.cursor == 0:
                self._key += 1
                job.key = self._key
            first = alone and used == 0 and not any(e.tokens for e in out)  # nothing else in this step
            if rest <= room or (not self.chunks and first):
                out.append(EmbedItem(job.key, tokens[job.cursor:], pair_at, job.cursor, True))
                planned[job.key] = (job, job.sent)
                job.sent += 1
                job.cursor = 0
                used += rest
                continue
            worth = room >= MIN_CHUNK or (room > 0 and first)
            if self.chunks and worth and (job.cursor or self.partial < MAX_PARTIAL):
                n = room
                out.append(EmbedItem(job.key, tokens[job.cursor:job.cursor + n], pair_at, job.cursor, False))
                planned[job.key] = (job, job.sent)  # an error on a chunk fails the job
                job.cursor += n
                used += n
            break
        if not planned:
            self.inflight.pop(step, None)
        return used

    def update(self, step: int, vectors) -> list[EmbedEvent]:
        events: list[EmbedEvent] = []
        for v in vectors:
            job, index = self.inflight.get(step, {}).get(v.key, (None, 0))
            if job is None or self.jobs.get(job.id) is not job:
                continue  # the job ended (cancelled, failed) while the step ran
            if not v.error:
                job.received += 1
            events.append(EmbedEvent(job.id, index, v.data, v.error, v.code))
            if v.error or job.received == len(job.items):
                self.remove(job.id)
        self.inflight.pop(step, None)
        return events

    def reset(self) -> None:
        """The worker is gone: inputs in flight are planned again (embedding is idempotent),
        unless this job's inputs were in flight at MAX_LOST deaths: then it is given up
        (`poisoned`), so an input that crashes the runtime cannot crash it forever."""
        self.inflight.clear()
        self.drops.clear()  # the runtime's half-sent inputs died with it
        for job in list(self.jobs.values()):
            if job.sent > job.received or job.cursor:
                job.cursor = 0
                job.lost += 1
                if job.lost >= MAX_LOST:
                    self.jobs.pop(job.id)
                    self.poisoned.append(job.id)
            job.sent = job.received

    def take_poisoned(self) -> list[str]:
        out, self.poisoned = self.poisoned, []
        return out
