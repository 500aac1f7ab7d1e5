"""The Runtime contract: a runtime holds weights and KV lanes and executes StepPlans.

Subclasses implement: `open_lane(seq, keep)` (the lane's KV keeps positions [0, keep) and
drops the rest), `close_lane(seq)` (the lane is retired; its KV stays, a cache entry the
scheduler may reuse), `copy_lane(src, dst, n)` (dst holds src's first n tokens, without recompute) and
`forward(runs)` (one batched forward over every run; logits for each run that samples,
valid until the next forward). `step` is the same for every runtime: close, open, copy,
forward, then sample each lane with its own LaneSampler keyed by (seed, position)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadRequest, EmbeddingUnsupported, ErrorReport, ModelLoadError
from ..plan import PLACEHOLDER, EmbedItem, KvIo, LaneError, Run, Sampled, Save, StepPlan, StepResult, Vector
from .kvstore import KvStore
from .sampling import LaneSampler
from .speculate import Drafter, LaneTokens, NgramDrafter, within_grammar


@dataclass(frozen=True)
class ModelInfo:
    n_vocab: int
    n_ctx: int  # tokens per lane
    n_lanes: int
    n_ctx_train: int
    description: str
    n_embd: int = 0  # the size of an embedding (0: unknown)
    embed_window: int = 0  # most tokens in one input to embed (0: the model cannot embed)
    embed_chunks: bool = False  # an input may be embedded in chunks over several steps (causal models)
    pooling: str = ""  # how an input's token states become one vector
    kind: str = "generate"  # or "embedding" (embeds only), "cross-encoder" (scores pairs only)
    speculate: bool = False  # decodes go at the lane's end (Run.draft, Run.more): the runtime places them
    rollback: bool = True  # a rejected draft can be taken back (not a recurrent state): drafts may be verified
    memory: str = "kv"  # how a sequence is kept: kv, swa, recurrent, hybrid (runtime/llamacpp.memory_kind)
    # how a cached prefix is reused: "kv" (cut anywhere) or "checkpoints" (only where the runtime
    # saved the lane's state: runtime/checkpoints.py, mirrored by sched/lanes.Slot.marks)
    prefix_cache: str = "kv"
    # a disk-tier entry is restored only where its header's marks say (checkpoints; a sliding
    # window's state, which llama.cpp saves without the cells outside the window: only whole)
    disk_marks: bool = False
    swa_window: bool = False  # a sliding-window cache kept window-sized (its prefix cache: checkpoints)

    def to_wire(self) -> dict:
        return self.__dict__.copy()


class Runtime(ABC):
    info: ModelInfo
    eog: np.ndarray  # end-of-generation token ids (banned when ignore_eos)

    # A runtime whose lanes can be saved to disk (save_state / load_state) names its KV format
    # here: it is part of the disk entries' fingerprint. Empty: no disk tier.
    kv_format: str = ""

    def __init__(self) -> None:
        self._samplers: dict[int, LaneSampler] = {}
        self._last: dict[int, int] = {}  # seq -> its last sampled token (resolves PLACEHOLDER)
        self._lltok: Any = None  # llguidance tokenizer, built on the first constrained lane
        self._broken: set[int] = set()  # lanes whose KV is lost until they are opened again
        self._faulted: set[int] = set()  # lanes that failed on their own (grammar, sampler) until reopened
        self.kv_store: KvStore | None = None  # the disk tier, attached by the worker
        self.lanes = LaneTokens()  # what each lane holds: drafts continue it (info.speculate)
        self.drafter: Drafter = NgramDrafter()  # prompt lookup, suffix trees (runtime/suffix.py) or a draft model

    @abstractmethod
    def open_lane(self, seq: int, keep: int) -> None: ...

    @abstractmethod
    def close_lane(self, seq: int) -> None: ...

    @abstractmethod
    def copy_lane(self, src: int, dst: int, n: int) -> None: ...

    @abstractmethod
    def forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        """Feed every run in one batch; return {seq: logits} for runs with sample=True: the
        last token's row, or for a run with drafts (ModelInfo.speculate) one row for each of
        its last draft + 1 tokens, shape (draft + 1, n_vocab)."""

    def embed(self, items: tuple[EmbedItem, ...]) -> list[np.ndarray]:
        """One float32 vector per item, in order. An embedding model pools and normalises as
        the model declares (a GGUF's pooling type, a sentence-transformers folder's modules);
        a cross-encoder answers pair items with its classifier's raw logits. Raises
        EmbeddingUnsupported when the model can do neither."""
        raise EmbeddingUnsupported(f"{type(self).__name__} cannot embed")

    def grammar_matcher(self, grammar: str):
        """A matcher for an llguidance grammar over this model's vocabulary. The tokenizer is
        built once, on the first constrained lane (about a second for a 50k vocabulary)."""
        import llguidance

        if self._lltok is None:
            self._lltok = self.grammar_tokenizer()
        matcher = llguidance.LLMatcher(self._lltok, grammar, log_level=0)
        if matcher.is_error():  # llguidance raises nothing: it allows only the end token, an empty answer
            # the daemon validated the grammar without a vocabulary (codec/grammar.py); what only
            # this vocabulary refuses (a token id past its end) is the request's fault all the same
            raise BadRequest(f"the grammar cannot be enforced with this model: {matcher.get_error()}")
        return matcher

    def grammar_tokenizer(self):
        raise NotImplementedError(f"{type(self).__name__} has no grammar support")

    def lane_len(self, seq: int) -> int | None:
        """Positions the lane's KV holds (None: this runtime cannot tell)."""
        return None

    def save_state(self, seq: int, n: int) -> bytes | None:
        """The lane's KV, holding at least its first n tokens, as bytes load_state takes back
        (the lane is left as it is: it may be running). None: this runtime has no disk tier."""
        return None

    def state_marks(self, seq: int, n: int) -> tuple[int, ...]:
        """Where a saved lane of n tokens can be cut when it is restored, for a runtime whose
        prefix cache is checkpoints (runtime/checkpoints.py); () for a KV cache (anywhere)."""
        return ()

    def load_state(self, seq: int, data: bytes, n: int) -> bool:
        """Put saved KV into the lane and keep its first n tokens; False if it does not fit
        this runtime (the lane is then left empty)."""
        return False

    def close(self) -> None:
        """Release weights and KV."""

    def step(self, plan: StepPlan) -> StepResult:
        t0 = time.perf_counter()
        failed: list[int] = []
        kept: list[tuple[int, int]] = []  # failed lanes that still hold a prefix: (seq, tokens)
        errors: list[LaneError] = []
        for seq in plan.closes:
            self._faulted.discard(seq)
            self._samplers.pop(seq, None)
            self._last.pop(seq, None)
            self.close_lane(seq)
            self.drafter.end(seq)
        saved = sum(self._save(s) for s in plan.saves)
        if self.kv_store is not None:
            for key, pinned in plan.pins:
                self.kv_store.pin(key, pinned)
        for o in plan.opens:
            self._broken.discard(o.seq)
            self._faulted.discard(o.seq)
            self.open_lane(o.seq, o.keep)
            self.lanes.keep(o.seq, o.keep)
            self.drafter.begin(o.seq, o.ns, o.persist)
            held = self.lane_len(o.seq) if o.keep else None
            if held is not None and held < o.keep:
                self._short(o.seq, held, failed, kept)  # the cache entry it was seeded from is not all there
            try:
                matcher = self.grammar_matcher(o.sampling.grammar) if o.sampling.grammar else None
                self._samplers[o.seq] = LaneSampler(o.sampling, o.history, self.eog, matcher, o.context)
            except Exception as e:  # noqa: BLE001 -- this lane's own fault: it alone fails
                self._fault(o.seq, e, errors)
        for c in plan.copies:
            held = self.lane_len(c.src)
            if c.src in self._broken or (held is not None and held < c.n):
                self._break(c.dst, failed)
            else:
                self.copy_lane(c.src, c.dst, c.n)
                self.lanes.copy(c.src, c.dst, c.n)
                self.drafter.copy(c.src, c.dst, c.n)
                got = self.lane_len(c.dst) if c.n else None
                if got is not None and got < c.n:
                    self._short(c.dst, got, failed, kept)  # a recurrent state without a checkpoint at n
        restored = 0
        for ld in plan.loads:
            data = self.kv_store.get(ld.key) if self.kv_store is not None else None
            if data is not None and self.load_state(ld.seq, data, ld.n):
                restored += len(data)
                self.lanes.unknown(ld.seq, ld.n)
            else:
                self._break(ld.seq, failed)
        if self.kv_store is not None:
            for key in plan.drops:  # after the loads: an entry superseded in this plan is still read
                self.kv_store.drop(key)
        sampled: list[Sampled] = []
        drafted: list[tuple[int, int]] = []
        wants: dict[int, int] = {}  # seq -> drafts the scheduler allows its decode run
        runs = self._drafted(tuple(self._resolve(r, wants) for r in plan.runs
                                   if r.seq not in self._broken and r.seq not in self._faulted), wants)
        if runs:
            logits = self.forward(runs)
            for run in runs:
                if self.info.speculate:
                    self.lanes.fed(run.seq, run.pos, run.tokens)
                if run.sample:
                    try:
                        self._sample(run, logits[run.seq], sampled)
                    except Exception as e:  # noqa: BLE001 -- its grammar or sampler failed: it alone
                        self._fault(run.seq, e, errors)
                        continue
                    if run.draft:
                        drafted.append((run.seq, run.draft))
            if any(r.more and not r.draft for r in runs):
                self._decode_more(runs, sampled, errors)
        vectors = self._embed(plan.embeds) if plan.embeds else ()
        dropped, evicted = self.kv_store.take_dropped() if self.kv_store is not None else ([], 0)
        return StepResult(plan.step, tuple(sampled), time.perf_counter() - t0, vectors, tuple(failed),
                          tuple(dropped), KvIo(saved, restored, evicted), tuple(errors), tuple(drafted),
                          tuple(kept))

    def _sample(self, run: Run, logits: np.ndarray, out: list[Sampled]) -> None:
        """The run's token, or (a run with drafts: one logits row per fed token from its last
        sampled one on) tokens row by row while each equals the draft fed after it. The lane
        then keeps the drafts it accepted: the rest of the run's KV is dropped."""
        sampler = self._samplers[run.seq]
        first = run.pos + len(run.tokens) - run.draft  # the position the first row predicts
        drafts = run.tokens[len(run.tokens) - run.draft:]
        for j in range(run.draft + 1):
            s = sampler.sample(run.seq, logits[j] if run.draft else logits, first + j)
            out.append(s)
            self._last[run.seq] = s.token
            self.drafter.produced(run.seq, s.token)
            if j == run.draft or s.token != drafts[j] or sampler.ended(s.token):
                break
        if run.draft and j < run.draft:  # KV past the last accepted draft goes
            self.drop_tail(run.seq, first + j)
            self.lanes.keep(run.seq, first + j)

    def _decode_more(self, runs: tuple[Run, ...], sampled: list[Sampled], errors: list[LaneError]) -> None:
        """Multi-step decode (Run.more): the lanes whose decode runs allow it decode their
        own last samples again, together, one forward at a time, each until its allowance is
        spent or its sampler ends. The same tokens as one plan a step: a lane's samples are
        keyed by position, and it keeps the batch it had, less the lanes that ended."""
        # not a lane whose input ended it (a decode planned before its end token came back):
        # that token's KV is kept, for the next turn's prefix, but nothing after it is wanted
        left = {r.seq: (r.pos + len(r.tokens), r.more) for r in runs if r.more and not r.draft and r.sample
                and r.seq in self._samplers and not self._samplers[r.seq].ends_turn(r.tokens[-1])}
        while True:
            left = {q: v for q, v in left.items() if q in self._samplers and v[1] > 0
                    and not self._samplers[q].ended(self._last[q])}
            if not left:
                return
            more = tuple(Run(q, pos, (self._last[q],), True) for q, (pos, _) in left.items())
            logits = self.forward(more)
            for run in more:
                if self.info.speculate:
                    self.lanes.fed(run.seq, run.pos, run.tokens)
                try:
                    self._sample(run, logits[run.seq], sampled)
                except Exception as e:  # noqa: BLE001 -- its grammar or sampler failed: it alone
                    self._fault(run.seq, e, errors)
            left = {q: (pos + 1, n - 1) for q, (pos, n) in left.items()}

    def drop_tail(self, seq: int, n: int) -> None:
        """Keep only the lane's first n positions (speculating runtimes)."""
        raise NotImplementedError

    def _fault(self, seq: int, e: Exception, errors: list[LaneError]) -> None:
        """A lane's own failure: skip its runs until it is opened again; its request fails."""
        self._faulted.add(seq)
        self._samplers.pop(seq, None)
        errors.append(LaneError(seq, ErrorReport.of(e)))  # a LINKED error reaches its client typed

    def _short(self, seq: int, held: int, failed: list[int], kept: list[tuple[int, int]]) -> None:
        """The lane holds only its first `held` tokens, fewer than the plan counted on. With
        checkpoints (a recurrent state cut back to the deepest one it could) they are kept and
        reported, its runs skipped until it is opened again; otherwise it is emptied (_break)."""
        if self.info.prefix_cache != "checkpoints" or held <= 0:
            self._break(seq, failed)
            return
        self.lanes.keep(seq, held)
        self._broken.add(seq)
        if seq not in failed:
            failed.append(seq)
            kept.append((seq, held))

    def _break(self, seq: int, failed: list[int]) -> None:
        """The lane's KV is lost: empty it, skip its runs until it is opened again, and tell
        the scheduler (which requeues the lane's job to prefill from scratch)."""
        self.open_lane(seq, 0)
        self.lanes.keep(seq, 0)
        self._broken.add(seq)
        if seq not in failed:
            failed.append(seq)

    def _save(self, sv: Save) -> int:
        store = self.kv_store
        if store is None:
            return 0
        n = len(sv.tokens)
        held = self.lane_len(sv.seq)
        data = None
        if sv.seq not in self._broken and (held is None or held >= n):
            data = self.save_state(sv.seq, n)
        if data is None or not store.put(sv.key, sv.tokens, data, ns=sv.ns, marks=self.state_marks(sv.seq, n)):
            if data is None:
                store.reject(sv.key)
            return 0
        return len(data)

    def _embed(self, items: tuple[EmbedItem, ...]) -> tuple[Vector, ...]:
        """The step's embeddings. A batch the runtime refuses is tried again an item at a
        time, so only the items that fail get an error (typed for the API by the engine): not
        the worker, not the step's generations, not other clients' items in the batch."""
        try:
            out = self.embed(items)
        except Exception as e:  # noqa: BLE001 -- the items' error, isolated item by item
            if len(items) > 1:
                return tuple(v for it in items for v in self._embed((it,)))
            msg = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
            return (Vector(items[0].key, error=msg, code=getattr(e, "code", None) or ""),)
        return tuple(Vector(it.key, np.asarray(v, dtype="<f4").tobytes())
                     for it, v in zip(items, out, strict=True) if it.last and it.tokens)

    def _resolve(self, run: Run, wants: dict[int, int]) -> Run:
        if self.info.speculate and run.sample and len(run.tokens) == 1:
            return self._decode(run, wants)
        if PLACEHOLDER not in run.tokens:
            return run
        last = self._last_of(run.seq)
        return Run(run.seq, run.pos, tuple(last if t == PLACEHOLDER else t for t in run.tokens), run.sample,
                   run.draft, run.more)

    def _last_of(self, seq: int) -> int:
        if seq not in self._last:
            raise ValueError(f"lane {seq} has no sampled token to feed")
        return self._last[seq]

    def _decode(self, run: Run, wants: dict[int, int]) -> Run:
        """A decode in a speculating runtime: at the lane's end (a step in flight when it was
        planned may have kept drafts); `wants` gets the drafts the scheduler allows it."""
        token = self._last_of(run.seq) if run.tokens[0] == PLACEHOLDER else run.tokens[0]
        end = self.lane_len(run.seq)
        if run.draft and run.seq in self._samplers:
            wants[run.seq] = run.draft
        return Run(run.seq, run.pos if end is None else end, (token,), True, 0, run.more)

    def attach_draft(self, path: str) -> None:
        """Draft with a second, small model of the same vocabulary (--speculative draft)."""
        raise ModelLoadError(f"the {type(self).__name__} runtime cannot draft with a model ({path})")

    def _drafted(self, runs: tuple[Run, ...], wants: dict[int, int]) -> tuple[Run, ...]:
        """The decode runs in `wants` with their drafts (all lanes' at once: a draft model
        batches them), each cut where its lane's grammar would reject one."""
        if not wants:
            return runs
        proposed = self.drafter.propose({r.seq: (self.lanes.context(r.seq, r.tokens[0]), wants[r.seq])
                                         for r in runs if r.seq in wants})
        out = []
        for r in runs:
            drafts = proposed.get(r.seq) if r.seq in wants else None
            if drafts:
                sampler = self._samplers.get(r.seq)
                drafts = within_grammar(list(drafts)[:wants[r.seq]], sampler.matcher if sampler else None)
            out.append(Run(r.seq, r.pos, (*r.tokens, *drafts), True, len(drafts)) if drafts else r)
        return tuple(out)
