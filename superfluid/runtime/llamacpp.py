"""llama.cpp runtime through llama-cpp-python's low-level API.

One context holds every lane: n_seq_max = lanes, KV cells = lanes x n_ctx, and each lane
has its own KV stream (kv_unified off), so a sequence's attention never sees another lane's
cells: output does not depend on what else is in the batch. One `llama_decode` per step
feeds every run; logits are requested only for the last token of runs that sample.

Batch order matters for speed: with a stream per sequence, llama.cpp splits a batch into
micro-batches of *consecutive, increasing* sequence ids only (llama_batch_allocr::split_equal,
sequential), and each micro-batch is a graph compute of its own. So runs go into the batch
sorted by sequence (`by_seq`): lanes 3, 1, 2 in that order took three computes, sorted one.

Embeddings (runtime/llamacpp_embed.py) use a second context on the same weights, pooled as
the GGUF declares (`{arch}.pooling_type`: mean, CLS, last; a decoder that declares none is
mean-pooled) or as `pooling` says."""

from __future__ import annotations

import ctypes

import llama_cpp as ll
import numpy as np

from ..codec.tokenizer import quiet_llama_logs
from ..errors import EmbeddingUnsupported, ModelLoadError
from ..plan import EmbedItem, Run
from .base import ModelInfo, Runtime
from .checkpoints import Checkpoints, memory_kind, pack, unpack
from .llamacpp_embed import EMBED_WINDOW, POOLING, LlamaEmbedder
from .llamacpp_params import context_params, model_params, split_params
from .rope import derive, rope_key
from . import threadpool
from .threads import ThreadGovernor


def by_seq(items):
    """Runs (anything with a .seq) in increasing sequence order, as llama.cpp groups them
    into one micro-batch only when their sequence ids are consecutive and increasing."""
    return sorted(items, key=lambda r: r.seq)


class LlamaCppRuntime(Runtime):
    def __init__(self, path: str, *, lanes: int, n_ctx: int, threads: int, batch_tokens: int,
                 pooling: str | None = None, rpc_nodes: list | None = None, rpc_psk: bytes | None = None,
                 rpc_split: list[float] | None = None, rpc_output: str = "head", rpc_names: list[str] | None = None,
                 rpc_listen_fd: int = -1, rope: tuple[str, float, int] = ("", 0.0, 0), kv_bits: int = 16,
                 flash_attn: str = "auto", n_cpu_moe: int = 0, swa_full: bool = True,
                 offload: tuple = (999, (), "layer", ())):
        super().__init__()
        quiet_llama_logs()
        ll.llama_backend_init()
        self.rpc = None  # the RPC nodes the model is split over (runtime/rpc_link.py)
        params = model_params(n_cpu_moe, *offload)
        self.gpu_layers = offload[0]
        if rpc_nodes or rpc_names:
            from .rpc_link import RpcNodes
            self.rpc = RpcNodes(rpc_nodes or [], rpc_psk, names=rpc_names or [], listen_fd=rpc_listen_fd)
            try:
                params = split_params(path, self.rpc, rpc_split or [], output=rpc_output)
            except BaseException:
                self.close()
                raise
        self.model = ll.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            self.close()
            raise ModelLoadError(f"llama.cpp could not load {path}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        # read before the context exists: a context with a stretched rope reports the stretched
        # window as the model's trained one afterwards (llama.cpp 0.3.36: 32768 for SmolLM2 x4)
        n_ctx_train = ll.llama_model_n_ctx_train(self.model)
        self.rope = derive(*rope, n_ctx=n_ctx, n_ctx_train=n_ctx_train)
        self.ctx = ll.llama_init_from_model(self.model, context_params(lanes, n_ctx, threads, batch_tokens,
                                                                       self.rope, kv_bits, flash_attn, swa_full))
        if not self.ctx:
            self.close()
            if kv_bits != 16:
                raise ModelLoadError(f"--kv-bits {kv_bits}: llama.cpp cannot quantize this model's KV cache "
                                     f"(a quantized cache needs flash attention, which it could not enable)")
            raise ModelLoadError(f"llama.cpp could not create a context for {path} "
                                 f"({lanes} lanes x {n_ctx} tokens)")
        self.kv_bits = kv_bits
        self.mem = ll.llama_get_memory(self.ctx)
        self.memory = memory_kind(self.model)
        # a sliding window kept window-sized has dropped the cells a shorter lane would need
        self.n_swa = ll.llama_model_n_swa(self.model) if self.memory == "swa" and not swa_full else 0
        # a recurrent state (or such a window) cannot be cut anywhere: its prefix cache is
        # checkpoints (runtime/checkpoints.py)
        self.checkpoints = Checkpoints(self.ctx) if self.memory in ("recurrent", "hybrid") or self.n_swa else None
        self.n_batch = batch_tokens
        self.batch = ll.llama_batch_init(batch_tokens, 0, 1)
        n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.eog = np.array([t for t in range(n_vocab) if ll.llama_vocab_is_eog(self.vocab, t)],
                            dtype=np.int64)
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.model, desc, 256)
        self.threads = threads
        self.governor = ThreadGovernor(threads, lambda n: ll.llama_set_n_threads(self.ctx, n, n))
        self.pool = threadpool.attach(self.ctx, threads)  # as llama-server: its threads wait between steps
        self.pooling = pooling or self._declared_pooling() or "mean"  # a decoder that declares none: mean
        if self.pooling not in POOLING or self.pooling in ("none", "rank"):
            raise ModelLoadError(f"pooling '{self.pooling}' cannot make one vector per input: use mean, cls or last")
        self.n_embd = ll.llama_model_n_embd(self.model)
        self._embedder: LlamaEmbedder | None = None  # the embedding context, made on first use
        declared = self._declared_pooling()
        # a causal model's input may be embedded in chunks: a generative decoder (it declares
        # no pooling) or a last-token embedder; an encoder (mean, CLS) needs it whole
        chunked = declared in (None, "last") and not (ll.llama_model_has_encoder(self.model)
                                                        and not ll.llama_model_has_decoder(self.model))
        n_ctx_seq = ll.llama_n_ctx_seq(self.ctx)
        # an input never runs past the positions the model learned (an encoder's 512, say)
        window = min(EMBED_WINDOW, n_ctx_seq, n_ctx_train or n_ctx_seq)
        # the disk tier's entries fit only this build's state format and this KV layout
        self.kv_format = (f"llamacpp-{ll.__version__}-streams-{ll.llama_model_n_layer(self.model)}"
                          f"x{ll.llama_model_n_embd(self.model)}{rope_key(self.rope)}"
                          # a cell width never loads at another, nor another attention kernel's
                          f"{'' if kv_bits == 16 else f'-kv{kv_bits}'}"
                          f"{'' if kv_bits != 16 or flash_attn == 'auto' else f'-fa-{flash_attn}'}")
        self.info = ModelInfo(n_vocab=n_vocab, n_ctx=n_ctx_seq, n_lanes=lanes,
                              n_ctx_train=n_ctx_train,
                              description=desc.value.decode(errors="replace"),
                              n_embd=self.n_embd,
                              embed_window=window, embed_chunks=chunked, pooling=self.pooling,
                              speculate=True, memory=self.memory,
                              prefix_cache="checkpoints" if self.checkpoints else "kv",
                              disk_marks=self.memory != "kv", swa_window=bool(self.n_swa),
                              # a rejected draft's state cannot be taken back from a recurrent layer
                              # (nor a window's cells it has dropped)
                              rollback=self.checkpoints is None)

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, 256)
        return buf.value.decode(errors="replace") if n >= 0 else None

    def _declared_pooling(self) -> str | None:
        arch = self._meta("general.architecture")
        value = self._meta(f"{arch}.pooling_type") if arch else None
        names = {v: k for k, v in POOLING.items()}
        return names.get(int(value)) if value and value.isdigit() and int(value) in (1, 2, 3) else None

    def embed(self, items: tuple[EmbedItem, ...]) -> list[np.ndarray]:
        if any(it.pair_at for it in items):
            raise EmbeddingUnsupported("this model is not a cross-encoder: it cannot score pairs")
        if self._embedder is None:
            self._embedder = LlamaEmbedder(self.model, window=self.info.embed_window, threads=self.threads,
                                           pooling=self.pooling, chunked=self.info.embed_chunks, n_embd=self.n_embd)
        return self._embedder.embed(items)

    def grammar_tokenizer(self):
        from llguidance.llamacpp import lltokenizer_from_vocab

        return lltokenizer_from_vocab(self.vocab)

    def open_lane(self, seq: int, keep: int) -> None:
        self._cut(seq, keep)

    def _cut(self, seq: int, n: int) -> None:
        """The lane keeps its first n tokens. A recurrent memory refuses a cut anywhere but at
        its end (llama_memory_seq_rm returns false): the lane then goes back to its deepest
        checkpoint at or below n, or is emptied, and holds less than n (lane_len says how much;
        the caller reports it). Never left in a state the next decode would fail on."""
        if n > 0 and ll.llama_memory_seq_rm(self.mem, seq, n, -1) and self._window_holds(seq, n):
            if self.checkpoints is not None:
                self.checkpoints.keep(seq, n)
            return
        if n > 0 and self.checkpoints is not None:
            for p in self.checkpoints.below(seq, n):
                if (self.checkpoints.restore(seq, p) and ll.llama_memory_seq_rm(self.mem, seq, p, -1)
                        and self._window_holds(seq, p)):
                    self.checkpoints.keep(seq, p)
                    return
        ll.llama_memory_seq_rm(self.mem, seq, -1, -1)  # a whole sequence: every memory allows it
        if self.checkpoints is not None:
            self.checkpoints.keep(seq, -1)

    def _window_holds(self, seq: int, n: int) -> bool:
        """A window-sized sliding-window cache still holds what the token at n attends to:
        llama.cpp reuses the cells of positions that fell out of the window of the lane's last
        token, so a lane cut back further lacks them (llama-server's test: its oldest cell at or
        before n - n_swa; -1, none left, while the other layers still hold n tokens)."""
        return not self.n_swa or 0 <= ll.llama_memory_seq_pos_min(self.mem, seq) <= max(0, n - self.n_swa)

    def close_lane(self, seq: int) -> None:
        pass  # the KV stays: a prefix-cache entry until the slot is opened again

    def copy_lane(self, src: int, dst: int, n: int) -> None:
        # lanes live in separate KV streams: llama.cpp copies src's whole stream into dst's
        # (applied before the next decode), then dst drops everything from position n on (a
        # recurrent state: dst's goes back to src's checkpoint at n)
        ll.llama_memory_seq_rm(self.mem, dst, -1, -1)
        ll.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        if self.checkpoints is not None:
            self.checkpoints.copy(src, dst, n)
        self._cut(dst, n)

    def lane_len(self, seq: int) -> int | None:
        return ll.llama_memory_seq_pos_max(self.mem, seq) + 1

    def save_state(self, seq: int, n: int) -> bytes | None:
        # the whole lane: a running one is not touched; positions past n (a decode planned
        # before its job ended, a running job's newer tokens) are cut off by load_state
        size = ll.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        if ll.llama_state_seq_get_data(self.ctx, buf, size, seq) != size:
            return None
        if self.checkpoints is not None:  # a recurrent state is cut only where it was saved: they go along
            return pack(bytes(buf), self.checkpoints.up_to(seq, n))
        return bytes(buf)

    def state_marks(self, seq: int, n: int) -> tuple[int, ...]:
        # a recurrent state is whole only where the lane ends; a sliding window's is saved without
        # the cells outside the window of the lane's last token (llama_kv_cache::state_write), which
        # a token at n or later needs only if n < that last position (a window-sized cache has
        # dropped them anyway: its end and its checkpoints)
        held = self.lane_len(seq)
        end = (n,) if held == n or (self.memory == "swa" and not self.n_swa and held == n + 1) else ()
        if self.checkpoints is None:
            return end
        return tuple(sorted({*self.checkpoints.up_to(seq, n), *end}))

    def load_state(self, seq: int, data: bytes, n: int) -> bool:
        cps: dict[int, bytes] = {}
        if self.checkpoints is not None:
            self.checkpoints.keep(seq, -1)  # what the lane held before is gone
            try:
                data, cps = unpack(data)
            except ValueError:
                return False
            self.checkpoints.put(seq, {p: d for p, d in cps.items() if p <= n})
        src = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if ll.llama_state_seq_set_data(self.ctx, src, len(data), seq) != len(data):
            ll.llama_memory_seq_rm(self.mem, seq, -1, -1)
            return False
        if self.checkpoints is not None and self.lane_len(seq) != n:
            self._cut(seq, n)  # back to its checkpoint at n
        # a recurrent state refuses a cut: an entry holding more than n is no use here
        if not ll.llama_memory_seq_rm(self.mem, seq, n, -1) or self.lane_len(seq) != n:
            self._cut(seq, 0)
            return False
        return True

    def forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        b = self.batch
        i = 0
        out_index: dict[int, tuple[int, int]] = {}  # seq -> (batch index of its last token, drafts)
        for run in by_seq(runs):
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
                for k in range(i - 1 - run.draft, i):
                    b.logits[k] = 1
                out_index[run.seq] = (i - 1, run.draft)
        b.n_tokens = i
        self.governor.threads()  # fewer threads while other processes keep cores busy
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        if self.checkpoints is not None:  # the rule sched/lanes.Slot.marks mirrors
            for run in runs:
                if len(run.tokens) > 1 and not run.draft:
                    self.checkpoints.take(run.seq, run.pos + len(run.tokens))
        n_vocab = self.info.n_vocab

        def row(k: int) -> np.ndarray:
            ptr = ll.llama_get_logits_ith(self.ctx, k)
            if not ptr:  # llama.cpp refused the row (it logs why): an error, never a read through NULL
                raise RuntimeError(f"llama.cpp has no logits for batch row {k} of {i}")
            return np.ctypeslib.as_array(ptr, shape=(n_vocab,))
        return {seq: np.stack([row(k) for k in range(last - draft, last + 1)]) if draft else row(last)
                for seq, (last, draft) in out_index.items()}

    def drop_tail(self, seq: int, n: int) -> None:
        if not ll.llama_memory_seq_rm(self.mem, seq, n, -1):  # (speculation is refused where it would be)
            raise RuntimeError(f"llama.cpp refused to drop lane {seq}'s rejected drafts")

    def attach_draft(self, path: str) -> None:
        from .draft_model import DraftModel
        self.drafter = DraftModel(path, self.vocab, lanes=self.info.n_lanes, n_ctx=self.info.n_ctx,
                                  threads=self.threads, batch_tokens=self.n_batch)

    def close(self) -> None:
        self.drafter.close()
        embedder = getattr(self, "_embedder", None)
        if embedder is not None:
            embedder.close()
            self._embedder = None
        if getattr(self, "ctx", None):
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
        pool, self.pool = getattr(self, "pool", None), None
        if pool is not None:
            pool.close()  # after the context that computed on it
        if getattr(self, "model", None):
            ll.llama_model_free(self.model)
            self.model = None
        nodes, self.rpc = getattr(self, "rpc", None), None
        if nodes is not None:
            nodes.close()
