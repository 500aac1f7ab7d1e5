"""The scheduler: pure bookkeeping of jobs, lanes and a per-step token budget.

`schedule()` builds the next StepPlan: close finished lanes, admit waiting jobs FIFO into
free lanes, feed one token to every decoding lane, then spend what is left of the step's
token budget on prefill chunks (oldest admission first), so decoding lanes keep flowing
while a long prompt prefills. `update(plan, result)` folds the worker's sampled tokens into
the jobs and returns one TokenEvent per token, with the finish reason when a job ends.

Plans may be scheduled ahead of results (the engine keeps two in flight, so the worker
never waits for the daemon): a decode whose input is a token sampled in a step still in
flight carries PLACEHOLDER, which the worker replaces with the lane's last sample. A job's
context is prompt + output + `pending` (samples in flight); `scheduled` counts the context
tokens already sent to the worker. A job that ends while a run of it is in flight simply
has that run's token dropped in update()."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..plan import PLACEHOLDER, LaneOpen, Run, StepPlan, StepResult
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
    scheduled: int = 0  # context tokens sent to the worker (in flight included)
    pending: int = 0  # samples requested but not yet received
    output: list[int] = field(default_factory=list)
    finish: FinishReason | None = None

    @property
    def context_len(self) -> int:
        """Known context: prompt and received output."""
        return len(self.prompt) + len(self.output)

    @property
    def planned_len(self) -> int:
        """Context once every in-flight sample has arrived."""
        return self.context_len + self.pending

    @property
    def generated(self) -> int:
        return len(self.output) + self.pending

    def context(self, start: int, n: int) -> tuple[int, ...]:
        """Tokens [start, start+n) of the planned context; PLACEHOLDER past the known part."""
        lp, lo = len(self.prompt), len(self.output)
        out = []
        for i in range(start, start + n):
            out.append(self.prompt[i] if i < lp else self.output[i - lp] if i - lp < lo else PLACEHOLDER)
        return tuple(out)


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
        self._inflight: dict[int, dict[int, Job]] = {}  # step -> {seq: job} of its sampling runs
        self._step = 0

    # -- job control -------------------------------------------------------------------
    def add(self, job: Job) -> None:
        if job.id in self.jobs:
            raise ValueError(f"duplicate job {job.id}")
        if not job.prompt:
            raise ValueError("empty prompt")
        if job.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
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
        """The worker is gone with all its lanes and in-flight steps: drop running jobs and
        return them. Waiting jobs stay queued for the next worker."""
        lost = list(self.running.values())
        for job in lost:
            job.status, job.finish = JobStatus.FINISHED, FinishReason.ERROR
            self.jobs.pop(job.id, None)
        self.running.clear()
        self._to_close.clear()
        self._inflight.clear()
        self.lanes = LanePool(self.lanes.size)
        return lost

    @property
    def has_work(self) -> bool:
        return bool(self.running or self._to_close or len(self.waiting))

    # -- the step ----------------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        """The next plan, or None when there is nothing to send (every running job is
        waiting for in-flight samples it needs no further run for)."""
        closes = tuple(self._to_close)
        for seq in closes:
            self.lanes.release(seq)
        self._to_close.clear()

        opens: list[LaneOpen] = []
        while self.lanes.free and len(self.waiting):
            job = self.waiting.pop()
            assert job is not None
            seq = self.lanes.acquire()
            assert seq is not None
            job.seq, job.status, job.scheduled, job.pending = seq, JobStatus.PREFILLING, 0, 0
            self.running[seq] = job
            opens.append(LaneOpen(seq, job.sampling, tuple(job.output)))

        budget = self.step_tokens
        runs: list[Run] = []
        for job in self.running.values():
            if job.status == JobStatus.DECODING and self._wants_token(job):
                runs.append(self._run(job, 1))
                budget -= 1
        for job in self.running.values():
            if job.status == JobStatus.PREFILLING and budget > 0:
                n = min(job.planned_len - job.scheduled, budget)
                runs.append(self._run(job, n))
                budget -= n
        if not (opens or runs or closes):
            return None
        self._step += 1
        self._inflight[self._step] = {r.seq: self.running[r.seq] for r in runs if r.sample}
        return StepPlan(self._step, tuple(opens), tuple(runs), closes)

    def _wants_token(self, job: Job) -> bool:
        # the last token is known in advance: never schedule a run past max_tokens or the window
        return job.generated < job.max_tokens and job.planned_len < self.n_ctx

    def _run(self, job: Job, n: int) -> Run:
        assert job.seq is not None
        start = job.scheduled
        job.scheduled += n
        sample = job.scheduled == job.planned_len
        if sample:
            job.pending += 1
            job.status = JobStatus.DECODING
        return Run(job.seq, start, job.context(start, n), sample)

    def update(self, plan: StepPlan, result: StepResult) -> list[TokenEvent]:
        if result.step != plan.step:
            raise ValueError(f"result of step {result.step} for plan {plan.step}")
        owners = self._inflight.pop(plan.step, {})
        events: list[TokenEvent] = []
        for s in result.sampled:
            job = owners.get(s.seq)
            if job is None or job.status == JobStatus.FINISHED:
                continue  # finished (cancelled, stopped, eog) while the step ran
            job.pending -= 1
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
