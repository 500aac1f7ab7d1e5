"""StepPlan / StepResult: the whole contract between the scheduler and a runtime.

A plan says, for one step: which lanes (KV sequences) to close, which to open with which
sampling params, which lanes to seed from another lane's KV prefix, and which token runs
to feed at which positions (and whether to sample after the run). The result carries one
sampled token per run that asked for one.
Both travel over Link W as plain msgpack lists."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ErrorReport
from .request import SamplingParams

# A run's token that is "the token this lane sampled last": lets the scheduler plan a decode
# before the step that samples its input has come back. The runtime resolves it.
PLACEHOLDER = -1


@dataclass(frozen=True, slots=True)
class LaneOpen:
    seq: int
    sampling: SamplingParams
    history: tuple[int, ...] = ()  # tokens already generated (penalties on a resumed lane)
    keep: int = 0  # KV positions [0, keep) stay (a prefix the slot already holds); the rest is dropped
    # the context before `history` the penalties count (the prompt's last repeat_last_n tokens;
    # empty when no penalty applies): sent, not mirrored, so a cached prefix counts the same
    context: tuple[int, ...] = ()
    ns: str = ""  # the request's prefix-cache namespace: suffix drafts come only from text of the same one
    persist: bool = True  # False (store: false): its output is never kept on disk (the suffix store)


@dataclass(frozen=True, slots=True)
class Copy:
    """Seed lane dst with the first n tokens of lane src's KV (no recompute): the prefix
    cache's primitive. dst must be open; it is applied after opens, before runs."""
    src: int
    dst: int
    n: int


@dataclass(frozen=True, slots=True)
class Save:
    """Write lane seq's first n tokens of KV to the disk tier as entry `key` (the lane keeps
    them). Applied before opens: an evicted slot is saved before its next job wipes it.
    `tokens` are those n tokens: the entry's index, read back after a restart."""
    seq: int
    key: int
    tokens: tuple[int, ...]
    ns: str = ""  # the prefix cache's namespace the KV belongs to (request.GenRequest.cache_ns)


@dataclass(frozen=True, slots=True)
class Load:
    """Restore disk entry `key` into lane seq (opened with keep=0), keeping its first n
    tokens. Applied after copies, before runs. A load that fails (the entry is gone or
    corrupt) leaves the lane empty and is reported in StepResult.failed."""
    seq: int
    key: int
    n: int


def kv_key(tokens: Sequence[int], ns: str = "") -> int:
    """The disk tier's name for the KV of exactly these tokens (from position 0), in
    namespace `ns` (the same tokens in two namespaces are two entries)."""
    digest = hashlib.blake2b(array("i", tokens).tobytes(), digest_size=8, key=ns.encode()).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits: a msgpack int on every link


# Where SamplingParams.to_wire puts the grammar: a plan sends each grammar's text once and
# its lanes the text's index (eight choices of one request share one schema)
GRAMMAR_AT = 10
# What a step's opens may carry (a frame holds 16 MiB): their grammars' characters (each
# grammar once) and their tokens (history, penalty context) at TOKEN_BYTES each, the most a
# msgpack int takes here. Lanes past it open in a later step.
STEP_OPEN_BYTES = 4 << 20
TOKEN_BYTES = 5

# A runtime whose prefix cache is "checkpoints" (runtime/checkpoints.py: recurrent and hybrid
# models) saves a lane's state after every run of more than one token that verifies no drafts,
# keeping this many a lane (the oldest go first); the scheduler keeps the same positions
# (sched/lanes.Slot.marks) to know where a lane can be cut.
CHECKPOINTS = 8

# A restored token costs about this fraction of a prefilled one (a 1,500-token entry of the
# embedded model: 37 ms to load against 17 s to prefill): the step budget counts it so
RESTORE_COST = 64


@dataclass(frozen=True, slots=True)
class Run:
    seq: int
    pos: int  # position of tokens[0] in the lane
    tokens: tuple[int, ...]  # may hold PLACEHOLDER
    sample: bool  # sample a token after the last one (its position is pos + len(tokens))
    # Speculation: a decode run (one PLACEHOLDER token) may have the runtime draft up to this
    # many tokens after it and verify them in the same forward. The runtime then feeds the
    # lane's last token at the lane's end, whatever `pos` says (an earlier step in flight may
    # have accepted drafts), and returns one Sampled per token it keeps.
    draft: int = 0
    # Multi-step decode: a decode run may have the runtime decode the lane's own samples up
    # to this many times more in the same step, each a forward of its own, ending early
    # where the lane's sampler ends (an end token, a finished grammar); not where its drafts
    # were verified (a run that drafts is one forward). The runtime then returns one Sampled
    # per forward, as for accepted drafts.
    more: int = 0


@dataclass(frozen=True, slots=True)
class EmbedItem:
    """One input to embed (or, with pair_at, one (query, document) pair to score with a
    cross-encoder). Embeddings use no lane and keep no KV: the runtime pools the whole input
    in this step."""
    key: int  # the scheduler's id for the input, echoed with its vector
    tokens: tuple[int, ...]  # tokenized by the daemon, with the model's own special tokens
    pair_at: int = 0  # >0: tokens[pair_at:] are the pair's second segment (token type 1)
    # A long input of a causal model may come in chunks over several steps (ModelInfo
    # .embed_chunks): `pos` is where this chunk starts, and only the `last` one gets a vector.
    # A chunk with no tokens drops the runtime's partial state for the key (a cancelled input).
    pos: int = 0
    last: bool = True


@dataclass(frozen=True, slots=True)
class StepPlan:
    step: int
    opens: tuple[LaneOpen, ...] = ()
    runs: tuple[Run, ...] = ()
    closes: tuple[int, ...] = ()  # lanes retired: their sampler goes, their KV stays (a cache entry)
    copies: tuple[Copy, ...] = ()
    embeds: tuple[EmbedItem, ...] = ()  # inputs embedded in this step, after the runs
    saves: tuple[Save, ...] = ()  # KV written to the disk tier, before opens
    loads: tuple[Load, ...] = ()  # KV restored from the disk tier, after copies
    drops: tuple[int, ...] = ()  # disk entries no longer wanted (superseded by a longer one)
    # disk entries to pin (True: the store evicts them last) or unpin, after the saves
    pins: tuple[tuple[int, bool], ...] = ()

    @property
    def n_tokens(self) -> int:
        """Prefill-equivalent tokens of work (restored ones at their RESTORE_COST share)."""
        return (sum(len(r.tokens) for r in self.runs) + sum(len(e.tokens) for e in self.embeds)
                + sum(ld.n for ld in self.loads) // RESTORE_COST)

    def to_wire(self) -> list:
        grammars: dict[str, int] = {}  # each grammar's text once per plan; lanes name its index
        opens = []
        for o in self.opens:
            sampling = o.sampling.to_wire()
            if o.sampling.grammar:
                sampling[GRAMMAR_AT] = grammars.setdefault(o.sampling.grammar, len(grammars))
            opens.append([o.seq, sampling, list(o.history), o.keep, list(o.context), o.ns, o.persist])
        return [self.step,
                opens,
                [[r.seq, r.pos, list(r.tokens), r.sample, r.draft, r.more] for r in self.runs],
                list(self.closes),
                [[c.src, c.dst, c.n] for c in self.copies],
                [[e.key, list(e.tokens), e.pair_at, e.pos, e.last] for e in self.embeds],
                [[v.seq, v.key, list(v.tokens), v.ns] for v in self.saves],
                [[ld.seq, ld.key, ld.n] for ld in self.loads],
                list(self.drops),
                [[k, p] for k, p in self.pins],
                list(grammars)]

    @classmethod
    def from_wire(cls, w: list) -> StepPlan:
        step, opens, runs, closes, copies, embeds, saves, loads, drops, pins, grammars = w

        def sampling(p: list) -> SamplingParams:
            if p[GRAMMAR_AT] != "":
                p = [*p[:GRAMMAR_AT], str(grammars[p[GRAMMAR_AT]]), *p[GRAMMAR_AT + 1:]]
            return SamplingParams.from_wire(p)
        return cls(step,
                   tuple(LaneOpen(o[0], sampling(o[1]), tuple(o[2]), o[3], tuple(o[4] if len(o) > 4 else ()),
                                  str(o[5]) if len(o) > 5 else "", bool(o[6]) if len(o) > 6 else True)
                         for o in opens),
                   tuple(Run(s, p, tuple(t), bool(x), int(d), int(m)) for s, p, t, x, d, m in runs),
                   tuple(closes),
                   tuple(Copy(a, b, n) for a, b, n in copies),
                   tuple(EmbedItem(k, tuple(t), a, p, bool(x)) for k, t, a, p, x in embeds),
                   tuple(Save(v[0], v[1], tuple(v[2]), str(v[3]) if len(v) > 3 else "") for v in saves),
                   tuple(Load(q, k, n) for q, k, n in loads),
                   tuple(drops),
                   tuple((k, bool(p)) for k, p in pins))


@dataclass(frozen=True, slots=True)
class Sampled:
    seq: int
    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Vector:
    """An EmbedItem's result: float32 values, little-endian bytes on the wire (compact, exact).
    `error` (and the typed error's `code`) instead when the item failed in the runtime."""
    key: int
    data: bytes = b""
    error: str = ""
    code: str = ""


@dataclass(frozen=True, slots=True)
class KvIo:
    """The disk tier's traffic in one step, in bytes."""
    saved: int = 0
    restored: int = 0
    evicted: int = 0


@dataclass(frozen=True, slots=True)
class LaneError:
    """A lane's own failure (its grammar, its sampler): that request fails, no other, with
    the error as the runtime raised it (typed when it is the request's fault: errors.LINKED)."""
    seq: int
    error: ErrorReport


@dataclass(frozen=True, slots=True)
class StepResult:
    step: int
    sampled: tuple[Sampled, ...]
    elapsed_s: float = 0.0
    vectors: tuple[Vector, ...] = ()
    failed: tuple[int, ...] = ()  # lanes whose KV is lost (a load that failed): their runs were skipped
    dropped: tuple[int, ...] = ()  # disk entries gone (evicted for space, unwritable, corrupt)
    kvio: KvIo = KvIo()
    errors: tuple[LaneError, ...] = ()  # lanes that failed on their own: no sample from them
    drafted: tuple[tuple[int, int], ...] = ()  # (seq, tokens drafted) for runs that drafted any
    # (seq, n) for failed lanes that still hold their first n tokens (a recurrent state cut back
    # to a checkpoint below the planned cut): the scheduler seats their jobs from there
    held: tuple[tuple[int, int], ...] = ()

    def to_wire(self) -> list:
        return [self.step, [[s.seq, s.token, s.logprob, [list(t) for t in s.top]]
                            for s in self.sampled], self.elapsed_s,
                [[v.key, v.data, v.error, v.code] for v in self.vectors],
                list(self.failed), list(self.dropped),
                [self.kvio.saved, self.kvio.restored, self.kvio.evicted],
                [[e.seq, *e.error.to_wire()] for e in self.errors],
                [[q, n] for q, n in self.drafted],
                [[q, n] for q, n in self.held]]

    @classmethod
    def from_wire(cls, w: list) -> StepResult:
        step, sampled, elapsed, vectors, failed, dropped, kvio, errors, drafted, held = w
        return cls(step, tuple(Sampled(q, t, lp, tuple((a, b) for a, b in top))
                               for q, t, lp, top in sampled), elapsed,
                   tuple(Vector(k, bytes(d), str(e), str(c)) for k, d, e, c in vectors),
                   tuple(failed), tuple(dropped), KvIo(*kvio),
                   tuple(LaneError(int(e[0]), ErrorReport.from_wire(e[1:])) for e in errors),
                   tuple((int(q), int(n)) for q, n in drafted), tuple((int(q), int(n)) for q, n in held))
