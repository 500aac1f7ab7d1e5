"""A draft model for speculative decoding (`--speculative draft --draft-model GGUF`): a second,
small llama.cpp model of the target's vocabulary, loaded in the same worker.

For each decode run the scheduler allows drafts, it proposes up to k tokens greedily from the
lane's context. The target verifies them exactly as it verifies prompt-lookup drafts
(runtime/base.py `_sample`: the same acceptance, the same counter RNG), so the output is the
target's alone, greedy or sampled; the draft model decides only how many rows are accepted.

The draft model keeps one KV sequence per lane in its own context. Before drafting it compares
what that sequence holds with the lane's context (runtime/speculate.LaneTokens), drops what
differs (drafts the target rejected, a lane reopened on another prefix) and feeds the rest:
the prompt the first time (lazily, only for lanes that draft), then the tokens accepted since.
Every lane drafts in the same batched decodes: one for the catch-up, then one per draft.
A lane whose context holds unknown tokens (KV restored from disk) gets no drafts."""

from __future__ import annotations

import hashlib

import llama_cpp as ll
import numpy as np

from ..errors import ModelLoadError
from ..plan import PLACEHOLDER
from .llamacpp_params import context_params, model_params
from .speculate import Drafter


def vocab_texts(vocab) -> list[bytes]:
    """Every token's text, by id."""
    return [ll.llama_vocab_get_text(vocab, t) or b"" for t in range(ll.llama_vocab_n_tokens(vocab))]


def vocab_digest(texts: list[bytes]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(len(t).to_bytes(4, "little") + t)
    return h.hexdigest()


def check_same_vocab(target_vocab, path: str) -> None:
    """Refuse a draft model whose vocabulary is not the target's (token ids would mean other
    text: every draft rejected at best). Reads only the draft GGUF's vocabulary."""
    mp = model_params()
    mp.vocab_only = True
    model = ll.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise ModelLoadError(f"llama.cpp could not read the draft model {path}")
    try:
        theirs = vocab_texts(ll.llama_model_get_vocab(model))
    finally:
        ll.llama_model_free(model)
    ours = vocab_texts(target_vocab)
    if len(theirs) != len(ours):
        raise ModelLoadError(f"the draft model {path} has another vocabulary: {len(theirs)} tokens, "
                             f"the model it drafts for {len(ours)}; a draft model must share its vocabulary")
    if vocab_digest(theirs) != vocab_digest(ours):
        i = next(i for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) if a != b)
        there, here = theirs[i].decode(errors="replace"), ours[i].decode(errors="replace")
        raise ModelLoadError(f"the draft model {path} has another vocabulary: token {i} is {there!r} there, "
                             f"{here!r} in the model it drafts for; a draft model must share its vocabulary")


class DraftModel(Drafter):
    def __init__(self, path: str, target_vocab, *, lanes: int, n_ctx: int, threads: int, batch_tokens: int):
        check_same_vocab(target_vocab, path)
        self.model = ll.llama_model_load_from_file(path.encode(), model_params())  # on the target's device(s)
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load the draft model {path}")
        # a stream per lane, as the target's
        self.ctx = ll.llama_init_from_model(self.model, context_params(lanes, n_ctx, threads, batch_tokens))
        if not self.ctx:
            self.close()
            raise ModelLoadError(f"llama.cpp could not create a context for the draft model {path} "
                                 f"({lanes} lanes x {n_ctx} tokens)")
        self.mem = ll.llama_get_memory(self.ctx)
        self.n_ctx = ll.llama_n_ctx_seq(self.ctx)
        self.n_batch = batch_tokens
        self.batch = ll.llama_batch_init(batch_tokens, 0, 1)
        vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(vocab)
        self.eog = frozenset(t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(vocab, t))
        self.held: dict[int, list[int]] = {}  # seq -> the tokens its KV sequence holds

    def propose(self, wants: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        """Up to k greedy drafts for each lane {seq: (context, k)}: the context is the lane's
        tokens then its last sampled one, the token the target is about to feed."""
        feed: dict[int, tuple[int, list[int]]] = {}  # seq -> (position, tokens to feed)
        budget: dict[int, int] = {}
        for seq, (ctx, k) in wants.items():
            k = min(k, self.n_ctx - len(ctx))
            held = self.held.get(seq, [])
            n = min(len(held), len(ctx) - 1)  # at least the last token is fed: its logits give the first draft
            differ = np.flatnonzero(np.asarray(held[:n]) != np.asarray(ctx[:n]))
            same = int(differ[0]) if differ.size else n
            tail = ctx[same:]
            if k <= 0 or PLACEHOLDER in tail:
                continue
            ll.llama_memory_seq_rm(self.mem, seq, same, -1)
            self.held[seq] = held[:same]
            feed[seq], budget[seq] = (same, tail), k
        out: dict[int, list[int]] = {seq: [] for seq in feed}
        while feed:
            for seq, (_, tokens) in feed.items():
                self.held[seq] += tokens
            nxt = self._decode(feed)
            feed = {}
            for seq, tok in nxt.items():
                out[seq].append(tok)
                if len(out[seq]) < budget[seq] and tok not in self.eog:
                    feed[seq] = (len(self.held[seq]), [tok])
        return out

    def _decode(self, feed: dict[int, tuple[int, list[int]]]) -> dict[int, int]:
        """Feed each lane its tokens (in as many batches as they take) and return its greedy
        next token after the last one."""
        b = self.batch
        items = [(seq, pos + j, t, j == len(tokens) - 1) for seq, (pos, tokens) in sorted(feed.items())
                 for j, t in enumerate(tokens)]  # by sequence: llama.cpp batches consecutive ones (llamacpp.by_seq)
        out: dict[int, int] = {}
        for start in range(0, len(items), self.n_batch):
            chunk = items[start:start + self.n_batch]
            last: list[tuple[int, int]] = []
            for i, (seq, pos, tok, want) in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, int(want)
                b.seq_id[i][0] = seq
                if want:
                    last.append((seq, i))
            b.n_tokens = len(chunk)
            rc = ll.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} (draft model)")
            for seq, i in last:
                row = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
                out[seq] = int(row.argmax())
        return out

    def copy(self, src: int, dst: int, n: int) -> None:
        """dst starts as src's first n tokens (a shared prefix), without recompute."""
        ll.llama_memory_seq_rm(self.mem, dst, -1, -1)
        held = self.held.get(src, [])[:n]
        if held:
            ll.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
            ll.llama_memory_seq_rm(self.mem, dst, len(held), -1)
        self.held[dst] = held

    def close(self) -> None:
        if getattr(self, "ctx", None):
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            ll.llama_model_free(self.model)
            self.model = None

