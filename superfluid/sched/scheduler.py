"""The scheduler: pure bookkeeping of jobs, lanes and a per-step token budget.

`schedule()` builds the next StepPlan: close finished lanes, admit waiting jobs FIFO into
free lanes, feed one token to every decoding lane, then spend what is left of the step's
token budget on prefill chunks (oldest admission first), so decoding lanes keep flowing
while a long prompt prefills. `update(plan, result)` folds the worker's sampled tokens into
the jobs and returns one TokenEvent per token, with the finish reason when a job ends.

A job's context is prompt + output; `computed` counts the context tokens already in its
lane's KV. A run feeds context[computed:computed+n] and samples when it reaches the end,
so prefill, decode and (later) a resumed lane are the same operation."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..plan import LaneOpen, Run, StepPlan, StepResult
from ..request import FinishReason, Qos, SamplingParams
from .lanes import LanePool
from .queues import ClassQueues


class JobStatus(enum.IntEnum):
    WAITING = 0
    PREFILLING = 1
    DECODING = 2
    FINISHED = 3


@dataclass(eq=False)
class Job:
    id: str
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    qos: Qos = Qos.AGENT
    status: JobStatus = JobStatus.WAITING
    seq: int | None = None
    computed: int = 0
    output: list[int] = field(default_factory=list)
    finish: FinishReason | None = None

    @property
    def context_len(self) -> int:
        return len(self.prompt) + len(self.output)

    def context(self, start: int, n: int) -> tuple[int, ...]:
        lp = len(self.prompt)
        if start >= lp:
            return tuple(self.output[start - lp:start - lp + n])
        head = self.prompt[start:start + n]
        return tuple(head) + tuple(self.output[:max(0, n - len(head))])


@dataclass(frozen=True, slots=True)
class TokenEvent:
    job_id: str
    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]
    finish: FinishReason | None


class Scheduler:
    def __init__(self, *, lanes: int, n_ctx: int, step_tokens: int, eog: frozenset[int]):
        if step_tokens < lanes:
            raise ValueError("step_tokens must cover one token per lane")
        self.n_ctx = n_ctx
        self.step_tokens = step_tokens
        self.eog = eog
        self.lanes = LanePool(lanes)
        self.waiting: ClassQueues[Job] = ClassQueues()
        self.running: dict[int, Job] = {}  # seq -> job, in admission order
        self.jobs: dict[str, Job] = {}
        self._to_close: list[int] = []
        self._step = 0

    # -- job control -------------------------------------------------------------------
    def add(self, job: Job) -> None:
        if job.id in self.jobs:
            raise ValueError(f"duplicate job {job.id}")
        if not job.prompt:
            raise ValueError("empty prompt")
        if job.context_len >= self.n_ctx:
            raise ValueError("prompt does not fit the context window")
        self.jobs[job.id] = job
        self.waiting.push(job.qos, job.id, job)

    def finish(self, job_id: str, reason: FinishReason) -> bool:
        """End a job now (cancel, stop string). Its lane is closed at the next step."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return False
        if job.status == JobStatus.WAITING:
            self.waiting.remove(job_id)
        elif job.seq is not None and job.status != JobStatus.FINISHED:
            self._release(job)
        job.status, job.finish = JobStatus.FINISHED, job.finish or reason
        return True

    def reset(self) -> list[Job]:
        """The worker is gone with all its lanes: drop running jobs and return them.
        Waiting jobs stay queued for the next worker."""
        lost = list(self.running.values())
        for job in lost:
            job.status, job.finish = JobStatus.FINISHED, FinishReason.ERROR
            self.jobs.pop(job.id, None)
        self.running.clear()
        self._to_close.clear()
        self.lanes = LanePool(self.lanes.size)
        return lost

    @property
    def has_work(self) -> bool:
        return bool(self.running or self._to_close or len(self.waiting))

    # -- the step ----------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        closes = tuple(self._to_close)
        for seq in closes:
            self.lanes.release(seq)
        self._to_close.clear()

        opens: list[LaneOpen] = []
        while self.lanes.free and len(self.waiting):
            job = self.waiting.pop()
            assert job is not None
            job.seq = self.lanes.acquire()
            job.status = JobStatus.PREFILLING
            job.computed = 0
            self.running[job.seq] = job  # type: ignore[index]
            opens.append(LaneOpen(job.seq, job.sampling, tuple(job.output)))  # type: ignore[arg-type]

        budget = self.step_tokens
        runs: list[Run] = []
        for job in self.running.values():
            if job.status == JobStatus.DECODING:
                runs.append(self._run(job, 1))
                budget -= 1
        for job in self.running.values():
            if job.status == JobStatus.PREFILLING and budget > 0:
                n = min(job.context_len - job.computed, budget)
                runs.append(self._run(job, n))
                budget -= n
        self._step += 1
        return StepPlan(self._step, tuple(opens), tuple(runs), closes)

    def _run(self, job: Job, n: int) -> Run:
        start = job.computed
        return Run(job.seq, start, job.context(start, n), start + n == job.context_len)  # type: ignore[arg-type]

    def update(self, plan: StepPlan, result: StepResult) -> list[TokenEvent]:
        for run in plan.runs:
            job = self.running.get(run.seq)
            if job is not None and job.computed == run.pos:
                job.computed += len(run.tokens)
                if job.computed == job.context_len:
                    job.status = JobStatus.DECODING
        events: list[TokenEvent] = []
        for s in result.sampled:
            job = self.running.get(s.seq)
            if job is None or job.status == JobStatus.FINISHED:
                continue  # finished (cancelled, stopped) while the step ran
            job.output.append(s.token)
            reason = self._finish_reason(job, s.token)
            if reason is not None:
                job.finish = reason
                self._release(job)
                self.jobs.pop(job.id, None)
                job.status = JobStatus.FINISHED
            events.append(TokenEvent(job.id, s.token, s.logprob, s.top, reason))
        return events

    def _finish_reason(self, job: Job, token: int) -> FinishReason | None:
        if token in self.eog and not job.sampling.ignore_eos:
            return FinishReason.END_OF_TURN
        if len(job.output) >= job.max_tokens or job.context_len >= self.n_ctx:
            return FinishReason.LENGTH
        return None

    def _release(self, job: Job) -> None:
        assert job.seq is not None
        self.running.pop(job.seq, None)
        self._to_close.append(job.seq)
