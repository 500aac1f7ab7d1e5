"""Embeddings on llama.cpp: a second context on the model's weights, so the chat lanes' KV is
never touched by an embedding, made on the first embedding step.

Two ways, chosen by the model:
- **Chunked** (a causal model: a generative decoder that declares no pooling, or one that
  declares last-token pooling): the context outputs every token's final hidden state and this
  module pools them itself, so a long input can come in chunks over several steps (its KV
  stays in the context's sequence between them) and no step is longer than the scheduler's
  budget. Mean: the average of every token's state; CLS: the first; last: the last.
- **Whole** (an encoder that declares mean or CLS pooling: its attention looks both ways):
  llama.cpp pools each input in one batch.
Either way the KV of an input is dropped when its vector is made. Vectors are L2-normalised,
as llama-server's OpenAI endpoint returns them. Flash attention is off: its f16 accumulation
moves a vector by ~1e-4 in cosine; without it they equal llama.cpp's reference."""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp as ll
import numpy as np

from ..errors import EmbeddingUnsupported
from ..plan import EmbedItem

POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # llama_pooling_type
EMBED_WINDOW = 2048  # most tokens in one input to embed (and in one batch of the context)
EMBED_SEQS = 80  # sequences of a chunked context: a step's inputs (64 at most) plus half-sent ones (8)
WHOLE_SEQS = 64  # sequences of a pooling context (llama.cpp's pooling asserts at 80)


@dataclass
class _Partial:
    """A chunked input whose vector is not made yet."""
    seq: int
    total: np.ndarray  # the sum of its token states so far (float64)
    count: int = 0
    first: np.ndarray | None = None
    last: np.ndarray | None = None


def _normalise(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float32)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


class LlamaEmbedder:
    def __init__(self, model, *, window: int, threads: int, pooling: str, chunked: bool, n_embd: int):
        self.model, self.window, self.pooling, self.chunked, self.n_embd = model, window, pooling, chunked, n_embd
        cp = ll.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = window
        self.seqs = EMBED_SEQS if chunked else WHOLE_SEQS
        cp.n_seq_max = self.seqs
        cp.n_threads = cp.n_threads_batch = threads
        cp.embeddings = True
        cp.pooling_type = POOLING["none"] if chunked else POOLING[pooling]
        cp.kv_unified = True  # one stream: the batch's sequences share the window
        cp.flash_attn_type = 0
        cp.no_perf = True
        self.ctx = ll.llama_init_from_model(model, cp)
        if not self.ctx:
            raise EmbeddingUnsupported("llama.cpp could not create an embedding context for this model")
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(window, 0, 1)
        self.encoder = bool(ll.llama_model_has_encoder(model)) and not ll.llama_model_has_decoder(model)
        self._free = list(range(self.seqs - 1, -1, -1))
        self._partial: dict[int, _Partial] = {}

    def embed(self, items: tuple[EmbedItem, ...]) -> list[np.ndarray]:
        """A vector per last chunk; an empty array for other chunks and for drops."""
        out: list[np.ndarray] = []
        group: list[EmbedItem] = []
        used = 0
        for it in items:
            if len(it.tokens) > self.window:
                raise EmbeddingUnsupported(f"an input of {len(it.tokens)} tokens is over the "
                                           f"{self.window}-token embedding window")
            if not it.tokens:  # a cancelled half-sent input
                self._drop(it.key)
                continue
            new = sum(1 for g in group if g.pos == 0) if self.chunked else len(group)
            if group and (used + len(it.tokens) > self.window or len(group) == self.seqs or
                          (self.chunked and it.pos == 0 and new >= len(self._free))):
                out += self._run(group)
                group, used = [], 0
            group.append(it)
            used += len(it.tokens)
        if group:
            out += self._run(group)
        vectors = iter(out)
        return [next(vectors) if it.tokens else np.zeros(0, np.float32) for it in items]

    def _run(self, items: list[EmbedItem]) -> list[np.ndarray]:
        if self.chunked:
            return self._chunks(items)
        if any(it.pos or not it.last for it in items):
            raise EmbeddingUnsupported("this model embeds an input in one piece")
        self._fill([(it, k) for k, it in enumerate(items)])
        try:
            vecs = []
            for k in range(len(items)):
                ptr = ll.llama_get_embeddings_seq(self.ctx, k)
                if not ptr:
                    raise RuntimeError("llama.cpp returned no pooled embedding")
                vecs.append(_normalise(np.ctypeslib.as_array(ptr, shape=(self.n_embd,))))
            return vecs
        finally:
            ll.llama_memory_clear(self.mem, True)

    def _chunks(self, items: list[EmbedItem]) -> list[np.ndarray]:
        parts = []
        for it in items:
            p = self._partial.get(it.key)
            if it.pos == 0:
                if p is not None:
                    self._drop(it.key)
                p = self._partial[it.key] = _Partial(self._free.pop(), np.zeros(self.n_embd, np.float64))
            elif p is None or p.count != it.pos:
                raise RuntimeError(f"chunk at {it.pos} of an input this worker holds {p.count if p else 0} "
                                   f"tokens of")
            parts.append(p)
        try:
            n = self._fill([(it, p.seq) for it, p in zip(items, parts, strict=True)])
            rows = np.ctypeslib.as_array(ll.llama_get_embeddings(self.ctx), shape=(n, self.n_embd))
        except BaseException:
            for it in items:
                self._drop(it.key)
            raise
        out, i = [], 0
        for it, p in zip(items, parts, strict=True):
            r = rows[i:i + len(it.tokens)]
            i += len(it.tokens)
            p.total += r.sum(axis=0, dtype=np.float64)
            p.count += len(r)
            if p.first is None:
                p.first = r[0].copy()
            p.last = r[-1].copy()
            if it.last:
                v = {"mean": p.total / p.count, "cls": p.first, "last": p.last}[self.pooling]
                out.append(_normalise(np.asarray(v)))
                self._drop(it.key)
            else:
                out.append(np.zeros(0, np.float32))
        return out

    def _fill(self, items: list[tuple[EmbedItem, int]]) -> int:
        """Decode one batch: each item's tokens at its positions in its sequence, every token
        an output. Returns the token count."""
        b = self.batch
        i = 0
        for it, seq in items:
            for j, tok in enumerate(it.tokens):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, it.pos + j, 1, 1
                b.seq_id[i][0] = seq
                i += 1
        b.n_tokens = i
        rc = ll.llama_encode(self.ctx, b) if self.encoder else ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama.cpp failed to embed the batch (code {rc})")
        return i

    def _drop(self, key: int) -> None:
        p = self._partial.pop(key, None)
        if p is not None:
            ll.llama_memory_seq_rm(self.mem, p.seq, -1, -1)
            self._free.append(p.seq)

    def close(self) -> None:
        if self.ctx:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
