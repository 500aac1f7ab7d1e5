"""A step's result folded into the scheduler's jobs: each sampled token appended (a run
that verified drafts may return several), jobs that end released, lanes that failed on
their own ended alone, drafts counted for the speculation policy (sched/spec.py).

Owned by the Scheduler (sched/scheduler.py), which hands it the jobs and parts it folds into
and its own two ways for a job to leave its lane."""

from __future__ import annotations

from collections.abc import Callable

from ..plan import StepPlan, StepResult
from ..request import FinishReason
from .jobs import Counters, Job, JobStatus, ProgressEvent, TokenEvent
from .spec import SpecPolicy
from .tiers import Tiers

SAVE_PROMPT = 512  # a prompt that prefilled this many tokens is saved as soon as it has (not only at its end)

Owners = dict[int, tuple[Job, int, int]]  # a plan's runs: seq -> (job, incarnation, drafts)


class Results:
    def __init__(self, jobs: dict[str, Job], running: dict[int, Job], tiers: Tiers, spec: SpecPolicy,
                 counters: Counters, *, eog: frozenset[int], n_ctx: int,
                 release: Callable[[Job, bool], None], fail: Callable[[Job], None]):
        self.jobs = jobs
        self.running = running
        self.tiers = tiers
        self.spec = spec
        self.counters = counters
        self.eog = eog
        self.n_ctx = n_ctx
        self.release = release  # the job leaves its lane (True: at the end of a turn, its KV saved)
        self.fail = fail  # the job leaves its lane, whose KV is not known

    def tokens(self, plan: StepPlan, result: StepResult, owners: Owners) -> list[TokenEvent]:
        """The step's samples and lane errors, for the jobs that still own their runs."""
        events: list[TokenEvent] = []
        seen: set[int] = set()
        drafted = {q for q, _ in result.drafted}
        for s in result.sampled:
            job, inc, _ = owners.get(s.seq, (None, 0, 0))
            if job is None or job.incarnation != inc or job.status not in (JobStatus.PREFILLING,
                                                                           JobStatus.DECODING):
                continue  # ended or preempted while the step ran
            if s.seq in seen:  # a run's next token: the draft before it was accepted, its KV is in
                job.scheduled += 1  # (or a further decode of the lane's own sample: Run.more)
                if s.seq not in drafted:
                    self.counters.decode_tokens += 1
            else:
                seen.add(s.seq)
                job.pending -= 1
            job.output.append(s.token)
            if len(job.output) == 1 and self.tiers.disk is not None and job.persist \
                    and len(job.prompt) - (job.cached or 0) >= SAVE_PROMPT:
                # its first token: a long prompt's KV outlives a crash
                self.tiers.to_save[s.seq] = (job.prompt, job.cache_ns)
            reason = self._finish_reason(job, s.token)
            if reason is not None:
                job.finish = reason
                self.release(job, True)
                self.jobs.pop(job.id, None)
                job.status = JobStatus.FINISHED
            events.append(TokenEvent(job.id, s.token, s.logprob, s.top, reason, job.cached or 0))
        self._observe_drafts(result, owners)
        for e in result.errors:  # a lane that failed on its own: its job ends, no other
            owner = owners.get(e.seq)
            job = owner[0] if owner is not None else self.running.get(e.seq)
            if job is None or (owner is not None and job.incarnation != owner[1]) or job.seq is None or \
                    job.status not in (JobStatus.PREFILLING, JobStatus.DECODING):
                continue
            job.finish = FinishReason.ERROR
            self.fail(job)
            self.jobs.pop(job.id, None)
            job.status = JobStatus.FINISHED
            events.append(TokenEvent(job.id, -1, None, (), FinishReason.ERROR, job.cached or 0, e.error))
        return events


    def _observe_drafts(self, result: StepResult, owners: dict) -> None:
        for seq, n in result.drafted:
            job = owners.get(seq, (None,))[0]
            if job is not None:
                kept = max(0, min(n, sum(1 for s in result.sampled if s.seq == seq) - 1))
                self.spec.observe(job, n, kept)
                self.counters.draft_tokens += n
                self.counters.draft_accepted_tokens += kept

    def _finish_reason(self, job: Job, token: int) -> FinishReason | None:
        if token in self.eog and not job.sampling.ignore_eos:
            return FinishReason.END_OF_TURN
        if len(job.output) >= job.max_tokens or job.context_len >= self.n_ctx:
            return FinishReason.LENGTH
        return None


def progress(plan: StepPlan, owners: Owners) -> list[ProgressEvent]:
    """The prompt runs this step computed, for the jobs that report progress: the first run of
    an admission reports where it started (the cached part) before how far it got."""
    out: list[ProgressEvent] = []
    for r in plan.runs:
        job, inc, _ = owners.get(r.seq, (None, 0, 0))
        total = len(job.prompt) if job is not None else 0
        if job is None or not job.progress or job.incarnation != inc or r.pos >= total:
            continue
        cached = job.cached or 0
        if r.pos <= cached:
            out.append(ProgressEvent(job.id, total, cached, cached))
        out.append(ProgressEvent(job.id, total, cached, min(r.pos + len(r.tokens), total)))
    return out
