"""A generation job as the scheduler sees it, the token events it yields, and the
scheduler's counters (read by /metrics)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..errors import ErrorReport
from ..plan import PLACEHOLDER, LaneOpen
from ..request import FinishReason, Qos, SamplingParams


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
    cached: int | None = None  # prompt tokens seeded from KV at first admission
    incarnation: int = 0  # bumped at every admission; stale results are dropped
    admitted: int = 0  # admission order, for "youngest first"
    enqueued_step: int = 0
    order: int = 0
    preemptions: int = 0
    retried: bool = False  # requeued once after a worker died before it produced a token
    prior: tuple[int, ...] = ()  # tokens of this turn generated before this job (in the prompt)
    session: str | None = None  # the session it generates for (a pinned session's context stays warm)
    cache: tuple[int, float] | None = None  # a cache hint: (prompt tokens, seconds) to keep warm
    speculate: int | None = None  # most drafts per step (None: the scheduler's SpecPolicy default)
    persist: bool = True  # False (store: false): its KV is never saved to the disk tier
    cache_ns: str = ""  # its prefix-cache namespace: it reuses only KV of the same one
    progress: bool = False  # report its prompt's prefill progress (ProgressEvent)
    # shortest remaining work first (sched/srpt.py)
    warm: int = 0  # prompt tokens a slot held when it was queued: what admission will likely seed
    mark: int = -1  # progress when a short job last took its lane: not again before it moves past
    delayed: int = 0  # steps held back by shorter work; at aging_steps no short job passes it

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

    def known(self) -> list[int]:
        return self.prompt + self.output

    def kv_tokens(self) -> list[int]:
        """Known tokens whose KV has been sent to the worker."""
        return self.known()[:min(self.scheduled, self.context_len)]

    def lane_open(self, seq: int, keep: int) -> LaneOpen:
        """The lane opened for it: its sampling, what it generated before (penalties count
        it), the KV prefix kept, and its cache namespace (drafts stay within it)."""
        return LaneOpen(seq, self.sampling, self.prior + tuple(self.output), keep, self.penalty_context(),
                        self.cache_ns, self.persist)

    def penalty_context(self) -> tuple[int, ...]:
        """What the lane's penalties count before this turn's tokens (LaneOpen.context): the
        prompt up to `prior`, its last repeat_last_n tokens; nothing when no penalty applies."""
        sp = self.sampling
        if not sp.penalized:
            return ()
        before = self.prompt[:len(self.prompt) - len(self.prior)]
        return tuple(before if sp.repeat_last_n < 0 else before[-sp.repeat_last_n:])

    def context(self, start: int, n: int) -> tuple[int, ...]:
        """Tokens [start, start+n) of the planned context; PLACEHOLDER past the known part."""
        lp, lo = len(self.prompt), len(self.output)
        return tuple(self.prompt[i] if i < lp else self.output[i - lp] if i - lp < lo else PLACEHOLDER
                     for i in range(start, start + n))


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """How far a job's prompt has prefilled (for a job that asked: Job.progress)."""
    job_id: str
    total: int
    cached: int
    processed: int


@dataclass(frozen=True, slots=True)
class TokenEvent:
    job_id: str
    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]
    finish: FinishReason | None
    cached: int = 0
    error: ErrorReport | None = None  # its lane failed on its own (token is -1)


@dataclass
class Counters:
    admissions: int = 0
    cold_admissions: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    short_preemptions: int = 0  # of which: a short job took a lane of its own class (sched/srpt.py)
    evictions: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    coalesced: int = 0
    embed_tokens: int = 0
    disk_lookups: int = 0  # admissions that looked for their prefix in the disk tier
    restores: int = 0  # admissions seeded from the disk tier
    restored_tokens: int = 0  # prompt tokens restored from disk, not prefilled
    kv_saves: int = 0  # lanes' KV written to the disk tier
    kv_saved_bytes: int = 0
    kv_restored_bytes: int = 0
    kv_evicted_bytes: int = 0  # disk entries deleted to stay under --kv-disk-mb
    draft_tokens: int = 0  # tokens drafted for speculation and verified (sched/spec.py)
    draft_accepted_tokens: int = 0  # of those, drafts that matched the sampled token
