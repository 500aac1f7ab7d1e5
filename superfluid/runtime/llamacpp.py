"""llama.cpp runtime through llama-cpp-python's low-level API.

One context holds every lane: n_seq_max = lanes, KV cells = lanes x n_ctx, and each lane
has its own KV stream (kv_unified off), so a sequence's attention never sees another lane's
cells: output does not depend on what else is in the batch. One `llama_decode` per step
feeds every run; logits are requested only for the last token of runs that sample."""

from __future__ import annotations

import ctypes

import llama_cpp as ll
import numpy as np

from ..codec.tokenizer import quiet_llama_logs
from ..errors import ModelLoadError
from ..plan import Run
from .base import ModelInfo, Runtime


class LlamaCppRuntime(Runtime):
    def __init__(self, path: str, *, lanes: int, n_ctx: int, threads: int, batch_tokens: int):
        super().__init__()
        quiet_llama_logs()
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 999  # everything on the GPU when the build has one; no-op on CPU
        self.model = ll.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load {path}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        cp = ll.llama_context_default_params()
        cp.n_ctx = lanes * n_ctx
        cp.n_batch = batch_tokens
        cp.n_ubatch = min(batch_tokens, 512)
        cp.n_seq_max = lanes
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.kv_unified = False
        cp.no_perf = True
        self.ctx = ll.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise ModelLoadError(f"llama.cpp could not create a context for {path} "
                                 f"({lanes} lanes x {n_ctx} tokens)")
        self.mem = ll.llama_get_memory(self.ctx)
        self.n_batch = batch_tokens
        self.batch = ll.llama_batch_init(batch_tokens, 0, 1)
        n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.eog = np.array([t for t in range(n_vocab) if ll.llama_vocab_is_eog(self.vocab, t)],
                            dtype=np.int64)
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.model, desc, 256)
        self.info = ModelInfo(n_vocab=n_vocab, n_ctx=ll.llama_n_ctx_seq(self.ctx), n_lanes=lanes,
                              n_ctx_train=ll.llama_model_n_ctx_train(self.model),
                              description=desc.value.decode(errors="replace"))

    def grammar_tokenizer(self):
        from llguidance.llamacpp import lltokenizer_from_vocab

        return lltokenizer_from_vocab(self.vocab)

    def open_lane(self, seq: int, keep: int) -> None:
        ll.llama_memory_seq_rm(self.mem, seq, keep, -1)

    def close_lane(self, seq: int) -> None:
        pass  # the KV stays: a prefix-cache entry until the slot is opened again

    def copy_lane(self, src: int, dst: int, n: int) -> None:
        # lanes live in separate KV streams: llama.cpp copies src's whole stream into dst's
        # (applied before the next decode), then dst drops everything from position n on
        ll.llama_memory_seq_rm(self.mem, dst, -1, -1)
        ll.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        ll.llama_memory_seq_rm(self.mem, dst, n, -1)

    def forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        b = self.batch
        i = 0
        out_index: dict[int, int] = {}
        for run in runs:
            n = len(run.tokens)
            if i + n > self.n_batch:
                raise ValueError(f"plan has more than {self.n_batch} tokens")
            for j, tok in enumerate(run.tokens):
                b.token[i] = tok
                b.pos[i] = run.pos + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = run.seq
                b.logits[i] = 0
                i += 1
            if run.sample:
                b.logits[i - 1] = 1
                out_index[run.seq] = i - 1
        b.n_tokens = i
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        n_vocab = self.info.n_vocab
        return {seq: np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, k), shape=(n_vocab,))
                for seq, k in out_index.items()}

    def close(self) -> None:
        if getattr(self, "ctx", None):
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            ll.llama_model_free(self.model)
            self.model = None
