"""The memory fit: how long a window every lane gets, from what a token and a lane cost in the
model's memory (docs/models.md, "What each cache costs").

A model keeps, per lane: KV cells for each attention layer (a token's K and V at --kv-bits);
for a recurrent or hybrid model (Mamba, LFM2, Qwen3.5, Granite 4), one recurrent state a
lane whatever its length, plus up to plan.CHECKPOINTS copies of it (runtime/checkpoints.py);
for a sliding-window model (Gemma 3, gpt-oss), its window layers need only the last n_swa
positions, but llama.cpp's default full-size cache keeps every position so a lane can be cut
anywhere. Where that full-size cache leaves the window short of what was asked (or of the
trained window), `fit` keeps the window layers window-sized instead (--swa-cache auto), and
the prefix cache becomes checkpoints of that window.

The shape comes from the GGUF header (runtime/gguf_meta.py): which layers have attention
(a hybrid's per-layer head_count_kv, Qwen3.5's full_attention_interval), which attend to a
window (sliding_window_pattern, else llama.cpp's pattern for the architecture) and the
recurrent state's size by llama.cpp's own formulas (llama_hparams::n_embd_r, n_embd_s)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelLoadError
from ..plan import CHECKPOINTS
from .gguf_meta import read_values

KV_VALUE_BYTES = {16: 2.0, 8: 34 / 32, 4: 18 / 32}  # f16; q8_0 and q4_0 blocks of 32 values (34 and 18 bytes)
# llama.cpp's sliding-window layer pattern by architecture where the GGUF does not carry one
# (models/*.cpp load_swa_pattern: n, of every n layers the last attends to every position);
# an architecture not here (llama4's chunked attention, say) is fitted full-size only
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3n": 5, "gemma-embedding": 6, "gpt-oss": 2, "cohere2": 4,
               "exaone4": 4, "olmo2": 4}
STATE_BYTES = 4  # a recurrent state's values are f32
SWA_PAD = 256  # llama.cpp pads a cache's cells to this


@dataclass(frozen=True)
class MemoryShape:
    full_token: int  # f16 KV bytes a token in the layers that keep every position
    swa_token: int = 0  # f16 KV bytes a token in the sliding-window layers
    n_swa: int = 0  # their window
    state: int = 0  # recurrent state bytes a lane

    @classmethod
    def of_gguf(cls, path: str, fallback_kv_bytes: int) -> MemoryShape:
        """The shape from the GGUF's header; `fallback_kv_bytes` (every layer's KV, f16) for a
        file it cannot read."""
        arch = (read_values(path, {"general.architecture"}).get("general.architecture") or [""])[0]
        names = ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                 "attention.key_length", "attention.value_length", "attention.sliding_window",
                 "attention.sliding_window_pattern", "full_attention_interval", "ssm.conv_kernel",
                 "ssm.inner_size", "ssm.state_size", "ssm.group_count", "shortconv.l_cache", "wkv.head_size",
                 "token_shift_count")
        got = read_values(path, {f"{arch}.{k}" for k in names}) if arch else {}
        v = {k: got[f"{arch}.{k}"] for k in names if f"{arch}.{k}" in got}
        if "block_count" not in v:
            return cls(full_token=fallback_kv_bytes)
        return shape_of(arch, v)


def shape_of(arch: str, v: dict[str, list]) -> MemoryShape:
    """The shape from an architecture's header values ({name without the arch: values})."""
    one = lambda k, d=0: int(v[k][0]) if v.get(k) else d  # noqa: E731
    n_layer, n_embd = one("block_count"), one("embedding_length")
    n_head = max(int(x) for x in v.get("attention.head_count") or [0])
    heads = [int(x) for x in v["attention.head_count_kv"]] if v.get("attention.head_count_kv") else [n_head]
    heads = heads * n_layer if len(heads) == 1 else (heads + [0] * n_layer)[:n_layer]
    if one("full_attention_interval"):  # Qwen3.5/Qwen3-Next: every k-th layer attends, the rest are linear
        k = one("full_attention_interval")
        heads = [h if (i + 1) % k == 0 else 0 for i, h in enumerate(heads)]
    head_k = one("attention.key_length", n_embd // max(1, n_head))
    head_v = one("attention.value_length", head_k)
    layer_token = [h * (head_k + head_v) * 2 for h in heads]  # K and V, f16
    n_swa = one("attention.sliding_window")
    swa = _swa_layers(arch, v, n_layer) if n_swa else [False] * n_layer
    state = _state(v, n_embd) * sum(1 for h in heads if h == 0) if _recurrent(v) else 0
    return MemoryShape(full_token=sum(b for b, s in zip(layer_token, swa, strict=True) if not s),
                       swa_token=sum(b for b, s in zip(layer_token, swa, strict=True) if s),
                       n_swa=n_swa if any(swa) else 0, state=state)


def _swa_layers(arch: str, v: dict, n_layer: int) -> list[bool]:
    pattern = v.get("attention.sliding_window_pattern")
    if pattern and len(pattern) == n_layer:  # one flag a layer
        return [bool(x) for x in pattern]
    n = int(pattern[0]) if pattern else SWA_PATTERN.get(arch)
    if n is None:
        return [False] * n_layer  # not known: fitted as if every layer kept every position
    return [n == 0 or i % n < n - 1 for i in range(n_layer)]


def _recurrent(v: dict) -> bool:
    return any(v.get(k) for k in ("ssm.conv_kernel", "shortconv.l_cache", "wkv.head_size"))


def _state(v: dict, n_embd: int) -> int:
    """A recurrent layer's state bytes (llama_hparams::n_embd_r + n_embd_s, f32)."""
    one = lambda k: int(v[k][0]) if v.get(k) else 0  # noqa: E731
    if one("wkv.head_size"):  # RWKV
        r, s = max(1, one("token_shift_count")) * n_embd, n_embd * one("wkv.head_size")
    elif one("shortconv.l_cache"):  # LFM2
        r, s = n_embd * (one("shortconv.l_cache") - 1), 0
    else:  # Mamba's and the gated delta nets' convolution and state
        d_inner, d_state = one("ssm.inner_size"), one("ssm.state_size")
        r = max(0, one("ssm.conv_kernel") - 1) * (d_inner + 2 * one("ssm.group_count") * d_state)
        s = d_state * d_inner
    return (r + s) * STATE_BYTES


def kv_bytes_per_token(f16_bytes: int, kv_bits: int) -> int:
    """A token's KV bytes at --kv-bits, from its f16 size."""
    return max(1, round(f16_bytes * KV_VALUE_BYTES[kv_bits] / 2)) if f16_bytes else 0


@dataclass(frozen=True)
class Fit:
    n_ctx: int  # each lane's window
    swa_cache: str  # "full" or "window" (only a sliding-window model's is ever "window")
    token_bytes: int  # memory a token of a lane's window costs
    lane_bytes: int  # memory a lane costs whatever its length (recurrent state, checkpoints, a window)


def costs(shape: MemoryShape, kv_bits: int, swa_cache: str, ubatch: int = 512) -> tuple[int, int]:
    """(bytes a token, bytes a lane) with the sliding-window layers full-size or window-sized."""
    lane = shape.state * (1 + CHECKPOINTS)
    if swa_cache == "window" and shape.n_swa:
        swa = kv_bytes_per_token(shape.swa_token, kv_bits)
        cells = -(-(shape.n_swa + ubatch) // SWA_PAD) * SWA_PAD
        return kv_bytes_per_token(shape.full_token, kv_bits), lane + swa * (cells + CHECKPOINTS * shape.n_swa)
    return max(1, kv_bytes_per_token(shape.full_token + shape.swa_token, kv_bits)), lane


def fit(shape: MemoryShape, *, requested: int | None, n_ctx_train: int, lanes: int, kv_bits: int,
        model_bytes: int, mem_bytes: int, swa_cache: str = "auto", rollback: bool = False) -> Fit:
    """The window for every lane: what was asked, else the trained window capped so that every
    lane fits in half the memory left after the weights. A sliding-window model's cache is
    full-size where that gives the window (or `rollback`, speculation, needs it), else
    window-sized when that gives a longer one; `swa_cache` "full" or "window" decides."""
    modes = ["full"]
    if shape.n_swa and swa_cache == "window":
        modes = ["window"]
    elif shape.n_swa and swa_cache == "auto" and not rollback:
        modes = ["full", "window"]
    tries: list[Fit | ModelLoadError] = []
    for mode in modes:
        token, lane = costs(shape, kv_bits, mode)
        try:
            n = fit_context(requested=requested, n_ctx_train=n_ctx_train, lanes=lanes, kv_bytes_per_token=token,
                            model_bytes=model_bytes, mem_bytes=mem_bytes, lane_bytes=lane)
        except ModelLoadError as e:
            tries.append(e)
            continue
        got = Fit(n, mode, token, lane)
        if requested is not None or n >= (n_ctx_train or 4096):
            return got  # the whole window asked for
        tries.append(got)
    fits = [t for t in tries if isinstance(t, Fit)]
    if fits:
        return max(fits, key=lambda t: t.n_ctx)
    error = tries[-1]
    assert isinstance(error, ModelLoadError)
    raise error


def fit_context(*, requested: int | None, n_ctx_train: int, lanes: int,
                kv_bytes_per_token: int, model_bytes: int, mem_bytes: int, lane_bytes: int = 0) -> int:
    """The per-lane context: what was asked, else the trained window capped so that every
    lane's memory (a token's KV over its window, and what a lane costs whatever its length)
    fits in half the memory left after the weights."""
    free = max(0, mem_bytes - model_bytes)
    if requested is not None:
        need = lanes * (requested * kv_bytes_per_token + lane_bytes)
        if need > free:
            raise ModelLoadError(
                f"{lanes} lanes x {requested} tokens need {need / 2**30:.1f} GiB of KV cache and state; "
                f"{free / 2**30:.1f} GiB is available: lower --max-context or --max-batch")
        return requested
    cap = max(0, free // 2 // max(1, lanes) - lane_bytes) // max(1, kv_bytes_per_token)
    ctx = min(n_ctx_train or 4096, cap)
    return max(min(256, n_ctx_train or 256), ctx // 256 * 256)
