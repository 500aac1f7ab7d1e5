"""A staged (layer-range) forward on transformers, with a KV cache per session.

A `StageModel` holds decoder layers [first, last) of a Hugging Face causal LM, plus the token
embedding when first == 0 and the final norm and output head when last == n_layer. The other
layers are never allocated: the model skeleton is built on the meta device, only the held
modules are materialized, and only their tensors are read: from the safetensors files of a
Hugging Face folder, or from a GGUF in place (memory-mapped), dequantized one tensor at a time,
so a stage never holds the whole model in float32, in memory or on disk.

Each session keeps its K/V for these layers in growable per-session buffers, so a decoded
token costs one pass of one token through the layers, whatever the context length. One
`forward` call runs every multi-token item on its own and all single-token items of distinct
sessions together as ONE batched pass (ragged context lengths are masked; each row has its own
position ids). The full model is the stage [0, n_layer): the transformers runtime uses it so."""

from __future__ import annotations

import inspect
import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError
from .hf_convert import GgufWeights, gguf_weights, is_hf_dir
from .rope import Rope, hf_rope

# (session, position of the first row, tokens on the first stage or hidden states [n, hidden])
Item = tuple[Hashable, int, "Sequence[int] | np.ndarray"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class StageInput:
    session: str
    pos: int  # position of the first token / hidden row
    tokens: list[int] | None = None  # on the first stage
    hidden: np.ndarray | None = None  # [n, hidden] float32 on the other stages


class _KV:
    """One session's K and V for the stage's layers: [layers, kv_heads, capacity, head_dim]."""

    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
        self.k = torch.empty(n_layers, kv_heads, 0, head_dim, dtype=dtype)
        self.v = torch.empty_like(self.k)
        self.n = 0

    def reserve(self, n: int) -> None:
        cap = self.k.shape[2]
        if n <= cap:
            return
        cap = max(n, 2 * cap, 64)
        cap = (cap + 63) // 64 * 64
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], old.shape[1], cap, old.shape[3])
            new[:, :, :self.n] = old[:, :, :self.n]
            setattr(self, name, new)

    def clone(self, n: int) -> _KV:
        c = _KV.__new__(_KV)
        c.k = self.k[:, :, :n].clone()
        c.v = self.v[:, :, :n].clone()
        c.n = n
        return c


class _StepCache:
    """The duck-typed cache the attention modules call `update` on during one pass: it writes
    each row's new K/V into its session's buffer and returns the rows' whole K/V, zero-padded
    to the longest row (the mask hides the padding)."""

    def __init__(self, kvs: list[_KV], starts: list[int], lens: list[int], first: int):
        self.kvs, self.starts, self.lens, self.first = kvs, starts, lens, first
        self.total = max(s + n for s, n in zip(starts, lens, strict=True))

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        li = layer_idx - self.first
        if len(self.kvs) == 1:
            kv, p, n = self.kvs[0], self.starts[0], self.lens[0]
            kv.k[li, :, p:p + n] = k[0, :, :n]
            kv.v[li, :, p:p + n] = v[0, :, :n]
            return kv.k[li, :, :p + n].unsqueeze(0), kv.v[li, :, :p + n].unsqueeze(0)
        bk = k.new_zeros(k.shape[0], k.shape[1], self.total, k.shape[3])
        bv = torch.zeros_like(bk)
        for b, (kv, p, n) in enumerate(zip(self.kvs, self.starts, self.lens, strict=True)):
            kv.k[li, :, p:p + n] = k[b, :, :n]
            kv.v[li, :, p:p + n] = v[b, :, :n]
            bk[b, :, :p + n] = kv.k[li, :, :p + n]
            bv[b, :, :p + n] = kv.v[li, :, :p + n]
        return bk, bv


def _weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file that holds it."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return {k: folder / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    out: dict[str, Path] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            out.update({k: f for k in sf.keys()})  # noqa: SIM118 (safe_open is not a Mapping)
    return out


def _stretch(config, rope: Rope, source: str) -> None:
    """Apply --rope-scaling to the config before the rotary embedding is built from it: only
    for a model with one flat rope config (Llama's); a per-layer one would need each layer's."""
    current = getattr(config, "rope_parameters", None)
    if not isinstance(current, dict) or "rope_theta" not in current:
        raise ModelLoadError(f"{source}: --rope-scaling on transformers needs a model with one rope config "
                             f"(Llama's); serve a GGUF on llama.cpp instead")
    config.rope_parameters = hf_rope(rope, current)


class StageModel:
    def __init__(self, source: str, first: int, last: int, *, threads: int = 1, dtype: str = "float32",
                 rope: Rope | None = None):
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.set_num_threads(threads)
        gguf = None if is_hf_dir(source) else gguf_weights(source)  # a GGUF: read in place, only our layers
        if gguf is not None:
            cfg = {k: v for k, v in gguf.config.items() if k not in ("model_type", "architectures")}
            self.config = config = AutoConfig.for_model("llama", **cfg)
        else:
            self.config = config = AutoConfig.from_pretrained(str(source))
        if rope is not None:
            _stretch(config, rope, source)
        self.n_layer = int(config.num_hidden_layers)
        if not 0 <= first < last <= self.n_layer:
            raise ValueError(f"bad layer range [{first}, {last}) for {self.n_layer} layers")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}")
        self.dtype = DTYPES[dtype]
        self.first, self.last = first, last
        self.is_first, self.is_last = first == 0, last == self.n_layer
        self.hidden_size = int(config.hidden_size)
        self.n_vocab = int(config.vocab_size)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=self.dtype)
        body = skeleton.model
        self.layers = torch.nn.ModuleList(body.layers[first:last])
        self.embed = body.embed_tokens if self.is_first else None
        self.norm = body.norm if self.is_last else None
        self.lm_head = skeleton.lm_head if self.is_last else None
        self.rotary = type(body.rotary_emb)(config=config)  # its inv_freq buffer, computed on the CPU
        self._load(Path(source), skeleton, gguf)
        del skeleton, body
        n_head = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or n_head)
        self.head_dim = int(getattr(config, "head_dim", None) or self.hidden_size // n_head)
        params = inspect.signature(self.layers[0].forward).parameters
        self._cache_kw = next((n for n in ("cache", "past_key_values", "past_key_value") if n in params), "cache")
        self._kv: dict[Hashable, _KV] = {}
        self.tokens_fed = 0  # tokens passed through the layers (padding excluded): KV reuse is visible here
        self.passes = 0  # batched passes through the layers

    def _load(self, folder: Path, skeleton: torch.nn.Module, gguf: GgufWeights | None) -> None:
        from safetensors import safe_open

        held: dict[str, torch.nn.Module] = {f"model.layers.{self.first + i}": m for i, m in enumerate(self.layers)}
        if self.embed is not None:
            held["model.embed_tokens"] = self.embed
        if self.norm is not None:
            held["model.norm"] = self.norm
        if self.lm_head is not None:
            held["lm_head"] = self.lm_head
        files: dict[str, Path] = {n: folder for n in gguf.names()} if gguf is not None else _weight_files(folder)
        tied = self.lm_head is not None and "lm_head.weight" not in files
        if tied and self.embed is not None:
            held.pop("lm_head")
        for m in held.values():
            m.to_empty(device="cpu")
        if tied and self.embed is not None:
            self.lm_head.weight = self.embed.weight  # type: ignore[union-attr]
        wanted: dict[str, str] = {}  # tensor name in the files -> prefix.name in `held`
        for prefix, m in held.items():
            for name, _ in m.named_parameters():
                full = f"{prefix}.{name}"
                wanted[("model.embed_tokens." + name) if (tied and prefix == "lm_head") else full] = full
        missing = [k for k in wanted if k not in files]
        if missing:
            raise ModelLoadError(f"{folder}: tensors missing from the safetensors files: {missing[:5]}")
        by_file: dict[Path, list[str]] = {}
        for k in wanted:
            by_file.setdefault(files[k], []).append(k)
        params = {f"{p}.{n}": t for p, m in held.items() for n, t in m.named_parameters()}
        with torch.no_grad():
            if gguf is not None:
                for k in wanted:  # dequantized one tensor at a time
                    params[wanted[k]].copy_(torch.from_numpy(gguf.get(k)))
            for f, keys in by_file.items() if gguf is None else ():
                with safe_open(str(f), framework="pt") as sf:
                    for k in keys:
                        params[wanted[k]].copy_(sf.get_tensor(k))
        for m in held.values():
            m.eval()
            m.requires_grad_(False)

    @property
    def n_params(self) -> int:
        seen: dict[int, int] = {}
        for m in (self.embed, self.layers, self.norm, self.lm_head):
            if m is not None:
                seen.update({id(p): p.numel() for p in m.parameters()})
        return sum(seen.values())

    # -- sessions ---------------------------------------------------------------------------

    def sessions(self) -> int:
        return len(self._kv)

    def session_keys(self) -> list[Hashable]:
        return list(self._kv)

    def drop(self, session: Hashable) -> None:
        self._kv.pop(session, None)

    def clear(self) -> None:
        self._kv.clear()

    def cached(self, session: Hashable) -> int:
        kv = self._kv.get(session)
        return kv.n if kv is not None else 0

    def truncate(self, session: Hashable, n: int) -> None:
        kv = self._kv.get(session)
        if kv is not None:
            kv.n = min(kv.n, n)

    def copy(self, src: Hashable, dst: Hashable, n: int) -> None:
        kv = self._kv.get(src)
        if n < 0 or kv is None or kv.n < n:
            raise ValueError(f"session {src!r} holds {self.cached(src)} positions, not {n}")
        self._kv[dst] = kv.clone(n)

    def _session(self, session: Hashable, pos: int) -> _KV:
        kv = self._kv.get(session)
        if kv is None:
            kv = self._kv[session] = _KV(len(self.layers), self.kv_heads, self.head_dim, self.dtype)
        if pos > kv.n:
            raise ValueError(f"session {session!r}: position {pos} is past its {kv.n} cached positions")
        kv.n = pos  # a re-sent range overwrites what was cached from pos on
        return kv

    # -- forward ----------------------------------------------------------------------------

    def forward(self, items: Sequence[StageInput]) -> list[np.ndarray]:
        """Per item: hidden states [n, hidden] float32, or on the last stage the logits [vocab]
        float32 of its last position."""
        batch: list[Item] = []
        for it in items:
            x = it.tokens if self.is_first else it.hidden
            if x is None:
                raise ValueError(f"session {it.session!r}: the {'first' if self.is_first else 'next'} stage "
                                 f"takes {'tokens' if self.is_first else 'hidden states'}")
            batch.append((it.session, it.pos, x))
        return [o for o in self.run(batch, [True] * len(batch)) if o is not None]

    def run(self, items: Sequence[Item], want: Sequence[int]) -> list[np.ndarray | None]:
        """items: (session, pos, tokens or hidden [n, hidden]). Single-token items of sessions
        that appear once go through one batched pass; the rest one by one, in order. On the
        last stage, logits are computed only where `want` is set (None elsewhere): [vocab] for
        the last position, or [k, vocab] for the last k when want is k > 1 (drafts to verify)."""
        count: dict[Hashable, int] = {}
        for s, _, _ in items:
            count[s] = count.get(s, 0) + 1
        single = [i for i, (s, _, x) in enumerate(items) if count[s] == 1 and len(x) == 1]
        out: list[np.ndarray | None] = [None] * len(items)
        for i in range(len(items)):
            if i not in single:
                out[i] = self._pass([items[i]], [want[i]])[0]
        if single:
            for i, o in zip(single, self._pass([items[i] for i in single], [want[i] for i in single]), strict=True):
                out[i] = o
        return out

    @torch.inference_mode()
    def _pass(self, items: list[Item], want: list[int]) -> list[np.ndarray | None]:
        for s, p, x in items:
            if p < 0 or len(x) == 0:
                raise ValueError(f"session {s!r}: empty input or negative position")
            if p > self.cached(s):
                raise ValueError(f"session {s!r}: position {p} is past its {self.cached(s)} cached positions")
        kvs = [self._session(s, p) for s, p, _ in items]
        starts = [p for _, p, _ in items]
        lens = [len(x) for _, _, x in items]
        B, T = len(items), max(lens)
        for kv, p, n in zip(kvs, starts, lens, strict=True):
            kv.reserve(p + n)
        if self.is_first:
            ids = torch.zeros(B, T, dtype=torch.long)
            for b, (_, _, x) in enumerate(items):
                ids[b, :len(x)] = torch.as_tensor(np.asarray(x, dtype=np.int64))
            h = self.embed(ids)  # type: ignore[misc]
        else:
            h = torch.zeros(B, T, self.hidden_size, dtype=self.dtype)
            for b, (_, _, x) in enumerate(items):
                h[b, :len(x)] = torch.as_tensor(np.asarray(x, dtype=np.float32)).to(self.dtype)
        pos = torch.tensor(starts).unsqueeze(1) + torch.arange(T).unsqueeze(0)  # [B, T]
        cache = _StepCache(kvs, starts, lens, self.first)
        mask = self._mask(starts, lens, T, cache.total)
        rope = self.rotary(h, pos)
        kw = {self._cache_kw: cache}
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=pos, use_cache=True, position_embeddings=rope, **kw)
            if isinstance(h, tuple):  # older transformers return (hidden, ...)
                h = h[0]
        for kv, p, n in zip(kvs, starts, lens, strict=True):
            kv.n = p + n
        self.tokens_fed += sum(lens)
        self.passes += 1
        if not self.is_last:
            return [h[b, :n].float().numpy().copy() for b, n in enumerate(lens)]
        picks = [(b, t) for b in range(B) for t in range(lens[b] - int(want[b]), lens[b]) if want[b]]
        out: list[np.ndarray | None] = [None] * B
        if picks:
            rows = h[[b for b, _ in picks], [t for _, t in picks]]  # [R, hidden]
            logits = self.lm_head(self.norm(rows)).float().numpy()  # type: ignore[misc]
            at = 0
            for b in range(B):
                k = int(want[b])
                if k:
                    out[b] = (logits[at] if k == 1 else logits[at:at + k]).copy()
                    at += k
        return out

    @staticmethod
    def _mask(starts: list[int], lens: list[int], T: int, total: int) -> torch.Tensor | None:
        """None where sdpa's own (causal or full) attention is right: one row, starting at 0 or
        one token long. Else a boolean [B, 1, T, total] mask: query t of row b (position
        start+t) sees keys 0..start+t; padded queries see the row's keys (their output is dropped)."""
        if len(starts) == 1 and (starts[0] == 0 or lens[0] == 1):
            return None
        s = torch.tensor(starts).view(-1, 1, 1)
        n = torch.tensor(lens).view(-1, 1, 1)
        t = torch.arange(T).view(1, -1, 1)
        j = torch.arange(total).view(1, 1, -1)
        q = torch.minimum(t, n - 1)
        return (j <= s + q).unsqueeze(1)
