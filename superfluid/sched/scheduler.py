"""The scheduler: pure bookkeeping of jobs, KV slots, QoS classes and a per-step budget.

`schedule()` builds the next StepPlan:
1. retire lanes whose jobs ended (their KV stays in the slot as a prefix-cache entry);
2. admit waiting jobs in QoS order (best effective class, then first come) while a lane is
   free and the job's class is under its lane cap; an interactive or completion job that
   finds every lane busy preempts a lane of the lowest running class strictly below it
   (decoding before prefilling, youngest first), and the victim goes back to the front of
   its queue with its output as context: its client stream only pauses; a short job may take
   the lane of a longer one of its class (sched/srpt.py: shortest remaining work first);
3. seat each admitted job on the longest KV prefix any slot holds (a free slot in place,
   a running one by copy) or the disk tier (sched/seats.py, sched/tiers.py) so only the rest is prefilled; a
   job whose long prefix another job is prefilling right now waits for it (burst coalescing:
   computed once); a slot that holds a pinned prefix (sched/pins.py) is evicted last;
4. one token for every decoding lane, then prefill chunks and embedding inputs (sched/embeds.py)
   under the step's budget, better classes first (least remaining work first within one);
   while an interactive prompt prefills, lower classes do not prefill.
`update(plan, result)` folds the sampled tokens into their jobs and returns TokenEvents.
It owns the jobs, lanes and queues, and composes parts that own the rest: `tiers` (the disk
tier and pins, sched/tiers.py) and `results` (sched/results.py); seating (sched/seats.py), the
--deterministic row rules (sched/rows.py) and srpt are functions of what they are given.

Plans may be scheduled ahead of results (the engine keeps two in flight): a decode whose
input is a token still in flight carries PLACEHOLDER, which the worker resolves from the
lane's last sample. A job's context is prompt + output + `pending` samples in flight;
`scheduled` counts context tokens sent to the worker. Tokens that come back for a job that
has since ended or been preempted (another `incarnation`) are dropped: a preempted job
recomputes them, and greedy or seeded sampling (keyed by position) draws the same tokens."""

from __future__ import annotations

from ..plan import (RESTORE_COST, STEP_OPEN_BYTES, TOKEN_BYTES, Copy, EmbedItem, LaneOpen, Load, Run, Save, StepPlan,
                    StepResult)
from ..request import FinishReason, Qos
from .embeds import EmbedEvent, EmbedJob, EmbedQueue
from .jobs import Counters, Job, JobStatus, ProgressEvent, TokenEvent
from .lanes import KvSlots, Slot
from .prefix import common_prefix
from . import multistep, rows, seats, srpt
from .queues import WaitQueue
from .results import Owners, Results, progress
from .spec import SpecPolicy
from .tiers import Tiers

COALESCE_MIN = 64  # wait for another job's prefill only when it saves at least this much


class Scheduler:
    def __init__(self, *, lanes: int, n_ctx: int, step_tokens: int, eog: frozenset[int],
                 slots: int | None = None, class_lanes: dict[Qos, int] | None = None,
                 aging_steps: int = 256, embed_window: int = 0, embed_batch: int = 64, srpt: bool = True,
                 tail_rows: int = 1):
        if step_tokens < lanes:
            raise ValueError("step_tokens must cover one token per lane")
        self.max_lanes = lanes
        self.n_ctx = n_ctx
        self.step_tokens = step_tokens
        # prefill tokens per step; the engine sizes it from measured speed to keep steps short.
        # Start small: until the first step is measured, a long step would stall a chat.
        self.prefill_budget = min(step_tokens, 64)
        # embedding tokens per step: they run in the runtime's own embedding batch, not the
        # lanes' (step_tokens does not bound them); the engine sizes it from measured speed
        self.embed_budget = 512
        self.eog = eog
        self.slots = KvSlots(slots or lanes)
        if len(self.slots) < lanes:
            raise ValueError("need at least one KV slot per lane")
        self.class_lanes = dict(class_lanes or {})
        self.spec = SpecPolicy()  # drafts per decode run (the engine sets max_tokens when the runtime verifies them)
        self.srpt = srpt  # shortest remaining work first within a class (off: first come, first served)
        self.tail_rows = tail_rows  # the fewest rows of a new turn's prefill runs (sched/rows.py)
        self.decode_steps = 1  # forwards a plan of decodes alone may run (sched/multistep.py; the engine sets it)
        self.waiting = WaitQueue(aging_steps)
        self.embeds = EmbedQueue(embed_window, embed_batch)
        self.running: dict[int, Job] = {}  # seq -> job, in admission order
        self.jobs: dict[str, Job] = {}
        self.counters = Counters()
        self._to_close: list[int] = []
        self._inflight: dict[int, Owners] = {}  # step -> the runs it carries
        self._step = 0
        self._admitted = 0
        # owned parts: the disk tier and pins (beyond the slots), and the folding of results
        self.tiers = Tiers(self.counters, self.slots, pin_share=len(self.slots) - lanes)
        self.results = Results(self.jobs, self.running, self.tiers, self.spec, self.counters, eog=eog, n_ctx=n_ctx,
                               release=self._release, fail=self._fail)

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
        job.warm = self.slots.best_match(job.known(), Job.kv_tokens, ns=job.cache_ns)[1] if self.srpt else 0
        self.waiting.push(job, self._step)

    def add_embed(self, job: EmbedJob) -> None:
        """Queue inputs to embed; each must fit the model's embedding window."""
        if job.id in self.jobs:
            raise ValueError(f"duplicate job {job.id}")
        self.embeds.add(job, self._step)

    def finish(self, job_id: str, reason: FinishReason) -> bool:
        """End a job now (cancel, stop string). Its lane is retired at the next step."""
        if self.embeds.remove(job_id) is not None:
            return True
        job = self.jobs.pop(job_id, None)
        if job is None:
            return False
        if job.status == JobStatus.WAITING:
            self.waiting.remove(job_id)
        elif job.seq is not None and job.status != JobStatus.FINISHED:
            self._release(job, save=True)
        job.status, job.finish = JobStatus.FINISHED, job.finish or reason
        return True

    def reset(self, *, requeue: bool = False, retry: bool = False) -> list[Job]:
        """The worker is gone with all its KV and in-flight steps: drop the running jobs
        and return them; or, with requeue, put them back at the front of their queues with
        what they generated (as a preemption does: the next worker re-prefills them, and the
        counter-based sampler draws what it would have) and return them. Waiting jobs stay.

        With retry (the worker died), a running job that has produced no token yet is
        requeued once rather than dropped, and not returned: its client has seen nothing,
        so a worker that died before the job got going (killed while idle, its death not
        yet noticed) costs a re-prefill, not an error. A job that itself kills the worker
        fails at its second try."""
        lost: list[Job] = []
        for job in sorted(self.running.values(), key=lambda j: j.admitted, reverse=True):
            if requeue or (retry and not (job.output or job.retried)):
                job.retried = job.retried or not requeue
                job.status, job.pending, job.seq = JobStatus.WAITING, 0, None
                job.preemptions += 1
                self.waiting.push_front(job, self._step)
                if requeue:
                    lost.append(job)
            else:
                job.status, job.finish = JobStatus.FINISHED, FinishReason.ERROR
                self.jobs.pop(job.id, None)
                lost.append(job)
        self.running.clear()
        self._to_close.clear()
        self._inflight.clear()
        self.tiers.reset()
        self.embeds.reset()
        self.slots.clear()
        return lost

    def update(self, plan: StepPlan, result: StepResult) -> list[TokenEvent | EmbedEvent | ProgressEvent]:
        """A step's result folded into its jobs (sched/results.py): their events."""
        if result.step != plan.step:
            raise ValueError(f"result of step {result.step} for plan {plan.step}")
        owners = self._inflight.pop(plan.step, {})
        loads = self.tiers.loads.pop(plan.step, {})
        self.tiers.result(result, loads)
        for seq in result.failed:
            self._lost(seq, seq in loads, dict(result.held).get(seq, 0))
        events: list[TokenEvent | EmbedEvent | ProgressEvent] = list(self.embeds.update(plan.step, result.vectors))
        events += progress(plan, owners)
        events += self.results.tokens(plan, result, owners)
        return events

    def _lost(self, seq: int, restoring: bool, held: int = 0) -> None:
        """The lane's KV is gone (a failed restore) but for its first `held` tokens (a recurrent state back at a
        checkpoint): its job goes back to the front of its queue, to be prefilled from what it knows; as a
        preempted job, it draws the same tokens."""
        slot = self.slots[seq]
        job, slot.kv = slot.job, (slot.job.known() if slot.job else slot.kv)[:held]
        slot.keep_marks(held)
        if job is None:
            return
        self.running.pop(seq, None)
        self._to_close.append(seq)
        slot.job = None
        job.cached = None if restoring else job.cached  # (a restore: it was not restored after all)
        job.status, job.pending, job.seq = JobStatus.WAITING, 0, None
        self.waiting.push_front(job, self._step)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self._to_close or len(self.waiting) or self.embeds.has_work
                    or self.tiers.has_work)

    def queue_depth(self) -> dict[Qos, int]:
        return {q: self.waiting.count(q) + sum(1 for j in self.embeds.ready() if j.qos == q) for q in Qos}

    # -- the step ----------------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        """The next plan, or None when there is nothing to send."""
        step = self._step + 1
        opens: list[LaneOpen] = []
        copies: list[Copy] = []
        # slots this plan opens or copies from: their jobs may not be preempted in this plan,
        # or the worker (opens before copies) would wipe a copy's source or destination
        pinned: set[int] = set()
        saves: list[Save] = []
        drops: list[int] = []
        loads: list[Load] = []
        self.tiers.save_due(step, saves, drops)  # turns that ended, long prompts prefilled: to disk
        grammars: set[str] = set()  # the grammars this plan's opens carry (each sent once)
        carried = 0  # what the opens carry: grammar characters, and bytes of tokens (penalty context, history)
        for job in self.waiting.ordered(step, self._short if self.srpt else None):
            full = len(self.running) >= self.max_lanes
            g = job.sampling.grammar
            cost = (0 if g in grammars else len(g) if g.isascii() else 4 * len(g)) + TOKEN_BYTES * (
                len(job.output) + len(job.prior) + (len(job.prompt) if job.sampling.penalized else 0))
            if opens and carried + cost > STEP_OPEN_BYTES:
                continue  # it would make the step too big to send (a frame holds 16 MiB): it opens next step
            if full and job.qos.rank > Qos.COMPLETION and not (self._takes(job) and srpt.victim(
                    job, self.running.values(), pinned, self.waiting.aging_steps)):
                continue  # only interactive and completion jobs preempt, and short jobs longer ones
            if not self._admissible(job):
                continue
            restore = self.tiers.restore_for(job, self.tail_rows)
            if restore is not None and job.qos != Qos.INTERACTIVE and (loads or self._chat_prefilling()):
                continue  # one restore a step, and none while a chat prefills: it waits a step
            if full and not self._preempt_for(job, step, pinned):
                continue
            self._admit(job, step, opens, copies, pinned, restore, loads, saves, drops)
            carried += cost
            grammars.add(g)
        closes = tuple(self._to_close)
        self._to_close.clear()
        embeds: list[EmbedItem] = []
        runs = self._runs(step, embeds, sum(ld.n for ld in loads) // RESTORE_COST)
        pins = self.tiers.disk_pins(saves)
        if not (opens or runs or closes or embeds or saves or drops or pins):
            return None
        self._step = step
        self._inflight[step] = {r.seq: (self.running[r.seq], self.running[r.seq].incarnation, r.draft + r.more)
                                for r in runs}  # prefill chunks too: their progress is reported
        if loads:
            self.tiers.loads[step] = {ld.seq: ld.key for ld in loads}
        return StepPlan(step, tuple(opens), tuple(runs), closes, tuple(copies), tuple(embeds),
                        tuple(saves), tuple(loads), tuple(drops), pins)

    def _admissible(self, job: Job) -> bool:
        cap = self.class_lanes.get(job.qos)
        if cap is not None and sum(1 for j in self.running.values() if j.qos == job.qos) >= cap:
            return False
        return not self._coalesce(job)

    def _coalesce(self, job: Job) -> bool:
        """Should the job wait for a running job that is prefilling a long prefix it shares?"""
        tokens = job.known()
        for other in self.running.values():
            if other.status != JobStatus.PREFILLING or other.cache_ns != job.cache_ns:
                continue
            shared = min(common_prefix(tokens, other.known()), len(tokens) - 1)
            if shared <= other.scheduled or shared < COALESCE_MIN:
                continue
            # what waiting saves: the shared part, less what some other slot already holds
            have = self.slots.best_match(tokens, Job.kv_tokens, exclude=other.seq, ns=job.cache_ns)[1]
            if shared - have >= COALESCE_MIN:
                return True
        return False

    def _short(self, job: Job) -> bool:
        return self.srpt and srpt.short(job, self.prefill_budget)

    def _takes(self, job: Job) -> bool:
        """May this job take a lane of its class? A short one, when a KV slot is to spare (else
        the victim's KV would be evicted at once, to be prefilled again)."""
        return self._short(job) and len(self.slots) > self.max_lanes

    def _preempt_for(self, job: Job, step: int, pinned: set[int]) -> bool:
        victim, short = srpt.preemptee(job, self.running.values(), pinned, self.waiting.aging_steps, self._takes(job))
        if victim is None:
            return False
        self.counters.short_preemptions += short
        self._release(victim)
        victim.status, victim.pending, victim.seq = JobStatus.WAITING, 0, None
        victim.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.push_front(victim, step)
        return True

    def _admit(self, job: Job, step: int, opens: list[LaneOpen], copies: list[Copy], pinned: set[int],
               restore: tuple[int, int] | None, loads: list[Load], saves: list[Save], drops: list[int]) -> None:
        slot, keep, n = seats.seat(job, self.slots, self.tiers, self.counters, self.tail_rows,
                                   restore, step, copies, pinned, loads, saves, drops)
        slot.job, slot.kv, slot.last_used = job, [], step
        self.waiting.remove(job.id)
        if job.preemptions:  # waiting after a preemption: held back by better or shorter work
            job.delayed += step - job.enqueued_step
        self._admitted += 1
        job.seq, job.status, job.scheduled, job.pending = slot.seq, JobStatus.PREFILLING, n, 0
        job.incarnation += 1
        job.admitted = self._admitted
        if job.cached is None:
            job.cached = n
            self.counters.admissions += 1
            self.counters.cold_admissions += n == 0
            self.counters.cached_tokens += n
        self.running[slot.seq] = job
        pinned.add(slot.seq)
        opens.append(job.lane_open(slot.seq, keep))

    def _runs(self, step: int, embeds: list[EmbedItem], restore_cost: int) -> list[Run]:
        runs: list[Run] = []
        chat = self._chat_prefilling()
        solo = rows.solo(self.running.values(), step, self.tail_rows)
        for job in self.running.values():
            if not solo and job.status == JobStatus.DECODING and self._wants_token(job):
                draft = self.spec.grant(job, self._drafts_in_flight(job), self.n_ctx, chat)
                runs.append(self._run(job, 1, draft))
                self.counters.decode_tokens += 1
        decoded = sum(1 + r.draft for r in runs)  # drafts are verified in the same batch
        room = self.step_tokens - decoded  # the worker's batch holds step_tokens at most
        budget = min(max(1, self.prefill_budget - decoded - restore_cost), room)
        spent = 0  # prefill and embedding tokens planned so far in this step
        # prefills and embedding jobs share the step, best class first (a prefill before an
        # embedding job of its class: it holds a lane)
        work: list[Job | EmbedJob] = [j for j in self.running.values() if j.status == JobStatus.PREFILLING]
        self.embeds.take_drops(embeds)  # cancelled half-sent inputs: the runtime frees their state
        work += self.embeds.ready()
        # an embedding job ages as a waiting job does: steady prefill of better classes never starves it
        aging = self.waiting.aging_steps
        work.sort(key=lambda j: (self.waiting.effective(j, step), True, (0, 0), j.order) if isinstance(j, EmbedJob)
                  else (j.qos.rank, False, srpt.prefill_order(j, aging) if self.srpt else (0, 0), j.admitted))
        prefilling = [j for j in work if isinstance(j, Job)]
        if work and work[0].qos == Qos.INTERACTIVE and isinstance(work[0], Job):
            # a chat prefills alone, in the largest chunks: short steps exist to let it in
            work = [j for j in work if j.qos == Qos.INTERACTIVE]
            budget = room
        for w in work:
            if isinstance(w, EmbedJob):
                alone = not any(e.tokens for e in embeds) and spent == 0
                used = self.embeds.take(w, max(0, self.embed_budget - spent), alone, embeds, step)
                self.counters.embed_tokens += used
                spent += used
                if used == 0:
                    break  # its next input waits for a step of its own; nothing jumps ahead
                continue
            if budget - spent <= 0 or solo is False:  # (a decode step of --deterministic: no prefill)
                break
            n = rows.run(w, budget - spent, self.tail_rows)
            if n == 0:
                continue
            runs.append(self._run(w, n))
            self.counters.prefill_tokens += n
            spent += n
            if solo:
                break
        if self.srpt:
            srpt.count_passed(prefilling, {r.seq for r in runs})
        if self.spec.supported and self.tail_rows == 1 and not (embeds or len(self.waiting) or self.embeds.has_work):
            return multistep.extend(runs, self.running, self.decode_steps, self.n_ctx, self._drafts_in_flight)
        return runs

    def _wants_token(self, job: Job) -> bool:
        # the last token is known in advance: never schedule a run past max_tokens or the window
        return job.generated < job.max_tokens and job.planned_len < self.n_ctx

    def _run(self, job: Job, n: int, draft: int = 0) -> Run:
        assert job.seq is not None
        start = job.scheduled
        job.scheduled += n
        self.slots.ran(job.seq, n, job.scheduled)  # (the runtime may checkpoint the lane there)
        sample = job.scheduled == job.planned_len
        if sample:
            job.pending += 1
            job.status = JobStatus.DECODING
        return Run(job.seq, start, job.context(start, n), sample, draft)

    def _drafts_in_flight(self, job: Job) -> int:  # and further decodes (Run.more)
        n = 0
        for plan in self._inflight.values():
            owned = plan.get(job.seq) if job.seq is not None else None
            if owned is not None and owned[0] is job and owned[1] == job.incarnation:
                n += owned[2]
        return n

    def _release(self, job: Job, save: bool = False) -> None:
        """The job leaves its lane; the slot keeps the job's KV as a cache entry (and, at the
        end of a turn, the disk tier gets a copy)."""
        assert job.seq is not None
        slot: Slot = self.slots[job.seq]
        slot.kv, slot.job, slot.last_used, slot.persist = job.kv_tokens(), None, self._step, job.persist
        slot.ns = job.cache_ns
        self.running.pop(job.seq, None)
        self._to_close.append(job.seq)
        if save and self.tiers.disk is not None and job.persist:
            self.tiers.to_save[job.seq] = (slot.kv, slot.ns)
        if save:
            self.tiers.keep_pinned(job, slot.kv)

    def _fail(self, job: Job) -> None:
        """The job leaves a lane that failed on its own: what the lane holds is not known, so no cache entry."""
        assert job.seq is not None
        seq = job.seq
        self._release(job)
        self.slots[seq].kv, self.slots[seq].marks = [], []

    def _chat_prefilling(self) -> bool:
        return any(j.qos == Qos.INTERACTIVE and j.status == JobStatus.PREFILLING for j in self.running.values())
