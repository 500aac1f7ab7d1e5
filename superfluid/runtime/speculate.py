"""Speculative decoding in the runtime: prompt-lookup (n-gram) drafting, the tokens each
lane's KV holds (what drafts continue) and the grammar's cut. A draft model
(runtime/draft_model.py, `--speculative draft`) is the other drafter: its drafts are
verified the same way.

A decode run that the scheduler allows `draft` tokens gets, after the lane's last sampled
token, up to that many drafted tokens: the continuation of the longest recent n-gram of the
lane's context that occurred earlier in it (agents rewrite what they were just shown). All
of them go through the same batched forward as the other lanes, one logits row each. The
lane then samples row by row with its ordinary sampler (the counter RNG keyed by position,
the grammar, the penalties) and keeps the drafts while the sampled token equals the draft.
The tokens produced are therefore exactly those that decoding one token at a time would
have produced, greedy or sampled: for a point-mass draft, "accept when the sample equals
the draft" is the standard rejection rule (accepted with probability p(draft), otherwise a
sample from the rest, renormalised). A grammar never sees a draft it rejects: drafts are
cut at the first token the lane's matcher would not accept."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..plan import PLACEHOLDER

NGRAM_MAX = 4  # the longest suffix looked up
NGRAM_MIN = 2  # a single repeated token predicts too little to be worth a row
LOOKBACK = 8192  # the context searched (the most recent tokens)


def propose(context: np.ndarray, k: int) -> list[int]:
    """Up to k tokens continuing the longest suffix n-gram of `context` (NGRAM_MAX down to
    NGRAM_MIN) at its most recent earlier occurrence. Unknown tokens (PLACEHOLDER) never
    match and end a draft."""
    if k <= 0:
        return []
    ctx = context[-LOOKBACK:]
    n_ctx = ctx.shape[0]
    for n in range(min(NGRAM_MAX, n_ctx - 1), NGRAM_MIN - 1, -1):
        pattern = ctx[n_ctx - n:]
        if (pattern == PLACEHOLDER).any():
            continue
        # windows ending before the last token: a match is always followed by one
        hits = np.flatnonzero((sliding_window_view(ctx[:n_ctx - 1], n) == pattern).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            draft = ctx[start:start + k]
            unknown = np.flatnonzero(draft == PLACEHOLDER)
            return [int(t) for t in (draft[:unknown[0]] if unknown.size else draft)]
    return []


class LaneTokens:
    """The tokens each lane's KV holds, by position (PLACEHOLDER where unknown: KV restored
    from disk). Kept only by runtimes that speculate."""

    def __init__(self) -> None:
        self.held: dict[int, list[int]] = {}

    def keep(self, seq: int, n: int) -> None:
        self.held[seq] = self.held.get(seq, [])[:n]

    def copy(self, src: int, dst: int, n: int) -> None:
        self.held[dst] = self.held.get(src, [])[:n]

    def unknown(self, seq: int, n: int) -> None:
        self.held[seq] = [PLACEHOLDER] * n

    def fed(self, seq: int, pos: int, tokens: tuple[int, ...]) -> None:
        h = self.held.setdefault(seq, [])
        if len(h) < pos:
            h.extend([PLACEHOLDER] * (pos - len(h)))
        h[pos:pos + len(tokens)] = tokens

    def context(self, seq: int, last: int) -> list[int]:
        """What the lane holds, then `last`, its token about to be fed: what drafts continue."""
        return [*self.held.get(seq, ()), last]


class Drafter:
    """What a drafter is told of the lanes (each a no-op here): a lane opened for a request of
    a prefix-cache namespace, the tokens it produced, the lane retired, a prefix copied."""

    def propose(self, wants: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        """Up to k drafts for each lane {seq: (context, k)}: the context is the lane's tokens
        then its last sampled one, the token the target is about to feed."""
        raise NotImplementedError

    def begin(self, seq: int, ns: str, persist: bool = True) -> None:
        """`persist` False (store: false): nothing the lane produces may be kept on disk."""

    def produced(self, seq: int, token: int) -> None:
        pass

    def end(self, seq: int) -> None:
        pass

    def copy(self, src: int, dst: int, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class NgramDrafter(Drafter):
    """Prompt lookup: drafts are the continuation of the lane's own text (`propose`)."""

    def propose(self, wants: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        return {seq: propose(np.asarray(ctx, dtype=np.int64), k) for seq, (ctx, k) in wants.items()}


def within_grammar(drafts: list[int], matcher) -> list[int]:
    """The drafts cut at the first one a lane's grammar matcher (that has consumed the lane's
    last token) rejects."""
    if not drafts or matcher is None:
        return drafts
    try:
        return drafts[:max(0, int(matcher.validate_tokens(drafts)))]
    except Exception:  # noqa: BLE001 -- no drafts rather than a draft the grammar may refuse
        return []
