"""Sampling with a counter-based RNG: the uniform draw for a token is a pure function of
(seed, position), so a generation that is cut, batched differently or resumed draws exactly
what an uninterrupted one would. Greedy (temperature 0) never draws."""

from __future__ import annotations

from collections import deque

import numpy as np

from ..plan import Sampled
from ..request import SamplingParams

_M64 = (1 << 64) - 1
_TOP_P_WINDOW = 256  # try the nucleus within the best 256 tokens before sorting them all


def _mix64(x: int) -> int:
    # splitmix64 finalizer
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _M64
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """A uniform draw in [0, 1) keyed by (seed, position)."""
    x = _mix64((seed & _M64) ^ 0x9E3779B97F4A7C15)
    x = _mix64((x + (position & _M64) * 0xD1B54A32D192ED03) & _M64)
    return (x >> 11) * (1.0 / (1 << 53))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


class LaneSampler:
    """Per-lane sampling state: the params, the counts of the tokens the penalties see (the
    last repeat_last_n of the lane's context: `context`, the prompt before this turn, then
    `history` and what it samples) and, for a constrained lane, the grammar matcher (an
    llguidance LLMatcher that has consumed this turn's tokens)."""

    def __init__(self, params: SamplingParams, history: tuple[int, ...], eog: np.ndarray, matcher=None,
                 context: tuple[int, ...] = ()):
        self.p = params
        self.eog = eog
        self.matcher = matcher
        self.counts: dict[int, int] = {}
        self.recent: deque[int] = deque()  # the window's tokens, oldest first (repeat_last_n > 0)
        # logit_bias: ids and biases as arrays; -100 or less is a ban (as OpenAI documents)
        self.bias_ids = np.fromiter((t for t, _ in params.logit_bias), dtype=np.int64)
        self.bias = np.fromiter((-np.inf if b <= -100 else b for _, b in params.logit_bias), dtype=np.float32)
        if params.penalized:
            for t in (*context, *history):
                self._seen(t)
        if matcher is not None and history:
            matcher.consume_tokens(list(history))

    def _seen(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        n = self.p.repeat_last_n
        if n > 0:
            self.recent.append(token)
            if len(self.recent) > n:
                old = self.recent.popleft()
                left = self.counts[old] - 1
                if left:
                    self.counts[old] = left
                else:
                    del self.counts[old]

    def _masked(self, x: np.ndarray) -> np.ndarray:
        """Only the tokens the grammar allows next (the end token once it is complete)."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:x.shape[0]].astype(bool)
        if not allowed.any():  # the matcher failed: end the lane rather than run free
            allowed[self.eog] = True
        out = np.full(x.shape, -np.inf, dtype=np.float32)
        out[allowed] = x[allowed]
        return out

    def sample(self, seq: int, logits: np.ndarray, position: int) -> Sampled:
        p = self.p
        x = self._processed(logits)
        if self.matcher is not None:
            x = self._masked(x)
        dist = None
        if p.temperature <= 0.0:
            token = int(np.argmax(x))
        else:
            dist = self._distribution(x)
            token = self._draw(dist, uniform(p.seed, position))
        if p.penalized:
            self._seen(token)
        if self.matcher is not None:
            self.matcher.consume_token(token)
        if p.top_logprobs < 0:
            return Sampled(seq, token)
        if p.post_sampling:
            return _post_sampling(seq, token, dist, p.top_logprobs)
        lp = log_softmax(logits)
        top: tuple[tuple[int, float], ...] = ()
        if p.top_logprobs > 0:
            k = min(p.top_logprobs, lp.shape[0])
            idx = np.argpartition(-lp, k - 1)[:k]
            idx = idx[np.lexsort((idx, -lp[idx]))]
            top = tuple((int(i), float(lp[i])) for i in idx)
        return Sampled(seq, token, float(lp[token]), top)

    def ends_turn(self, token: int) -> bool:
        """Is this an end token the lane's request ends at (not one it ignores)?"""
        return not self.p.ignore_eos and bool(self.eog.size) and token in self.eog

    def ended(self, token: int) -> bool:
        """Does this token end the generation (nothing after it is worth verifying)?"""
        if self.matcher is not None and self.matcher.is_stopped():
            return True
        return self.ends_turn(token)

    def _processed(self, logits: np.ndarray) -> np.ndarray:
        p = self.p
        penal = self.counts and p.penalized
        if not (penal or p.ignore_eos or self.bias.size):
            return logits
        x = np.array(logits, dtype=np.float32)
        if p.ignore_eos and self.eog.size and not (self.matcher is not None and self.matcher.is_stopped()):
            x[self.eog] = -np.inf
        if penal:
            toks = np.fromiter(self.counts.keys(), dtype=np.int64)
            cnt = np.fromiter(self.counts.values(), dtype=np.float32)
            v = x[toks]
            if p.repeat_penalty != 1.0:
                v = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
            x[toks] = v - p.presence_penalty - p.frequency_penalty * cnt
        if self.bias.size:
            ok = self.bias_ids < x.shape[0]  # ids were checked against the tokenizer's vocabulary
            x[self.bias_ids[ok]] += self.bias[ok]
        return x

    def _draw(self, dist: tuple[np.ndarray, np.ndarray], u: float) -> int:
        """The token at `u` (a uniform draw) of the distribution."""
        cand, probs = dist
        cdf = np.cumsum(probs)
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return int(cand[min(i, cand.shape[0] - 1)])

    def _distribution(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, probabilities) that the draw chooses from, most probable first (ties by
        id): temperature, then top-k, typical-p or top-p, and min-p, as llama.cpp applies them."""
        p = self.p
        n = x.shape[0]
        if 0 < p.top_k < n:
            cand = np.argpartition(-x, p.top_k - 1)[:p.top_k]
        else:
            cand = np.arange(n)
        z = x[cand].astype(np.float64) / p.temperature
        z = np.exp(z - z.max())
        probs = z / z.sum()
        if 0.0 < p.typical_p < 1.0:
            cand, probs = _typical(cand, probs, p.typical_p)
        elif p.top_p < 1.0 and cand.shape[0] > _TOP_P_WINDOW:
            win = np.argpartition(-probs, _TOP_P_WINDOW - 1)[:_TOP_P_WINDOW]
            if probs[win].sum() >= p.top_p:
                cand, probs = cand[win], probs[win]
        # a deterministic order: most probable first, ties by token id
        order = np.lexsort((cand, -probs))
        cand, probs = cand[order], probs[order]
        keep = cand.shape[0]
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, max(1, int((probs >= p.min_p * probs[0]).sum())))
        return cand[:keep], probs[:keep]


def _post_sampling(seq: int, token: int, dist: tuple[np.ndarray, np.ndarray] | None, k: int) -> Sampled:
    """The chosen token's and the k likeliest tokens' logprobs in the distribution it was drawn
    from (renormalised, tokens of probability 0 left out); greedy (None): the token alone, sure."""
    if dist is None:
        return Sampled(seq, token, 0.0, ((token, 0.0),) if k > 0 else ())
    cand, probs = dist
    probs = probs / probs.sum()
    nz = probs > 0
    cand, probs = cand[nz], probs[nz]
    where = np.nonzero(cand == token)[0]
    lp = float(np.log(probs[where[0]])) if where.size else float("-inf")
    top = tuple((int(t), float(np.log(q))) for t, q in zip(cand[:k], probs[:k], strict=True)) if k > 0 else ()
    return Sampled(seq, token, lp, top)


def _typical(cand: np.ndarray, probs: np.ndarray, mass: float) -> tuple[np.ndarray, np.ndarray]:
    """Locally typical sampling (Meister et al. 2022, llama.cpp's typ_p): keep the tokens whose
    surprise is closest to the distribution's entropy until they hold `mass` of it."""
    logp = np.log(np.maximum(probs, 1e-300))
    shifted = np.abs(-logp - float(-(probs * logp).sum()))
    order = np.lexsort((cand, shifted))
    keep = int(np.searchsorted(np.cumsum(probs[order]), mass)) + 1
    sel = order[:max(1, keep)]
    p = probs[sel]
    return cand[sel], p / p.sum()
