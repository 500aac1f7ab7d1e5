"""llama.cpp's model and context parameters for the runtime (runtime/llamacpp.py) and the
draft model: where the weights go (the GPU when the build has one, --n-cpu-moe's experts in
host memory, a split over RPC nodes), and each context's lanes, window, KV cells, rope and
attention kernel."""

from __future__ import annotations

import ctypes
import os

import llama_cpp as ll

from .rope import Rope


def extra_buffers_safe() -> bool:
    """May llama.cpp repack weights into its extra CPU buffer types? Its AMX kernels take a
    general protection fault on CPUs that advertise AMX inside VMs that do not run it (seen on
    the Xeon test machines: every decode of a Q4_1 model crashes the process). Off where the CPU
    says AMX, unless SUPERFLUID_LLAMA_EXTRA_BUFTS=1."""
    forced = os.environ.get("SUPERFLUID_LLAMA_EXTRA_BUFTS")
    if forced is not None:
        return forced == "1"
    try:
        with open("/proc/cpuinfo") as f:
            return not any(line.startswith("flags") and " amx_" in line for line in f)
    except OSError:
        return True


ROPE_TYPES = {"none": ll.LLAMA_ROPE_SCALING_TYPE_NONE, "linear": ll.LLAMA_ROPE_SCALING_TYPE_LINEAR,
              "yarn": ll.LLAMA_ROPE_SCALING_TYPE_YARN}


KV_TYPES = {16: ll.GGML_TYPE_F16, 8: ll.GGML_TYPE_Q8_0, 4: ll.GGML_TYPE_Q4_0}  # --kv-bits: the cache's cells


FLASH_ATTN = {"off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED, "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
              "auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO}


def context_params(lanes: int, n_ctx: int, threads: int, batch_tokens: int, rope: Rope | None = None,
                   kv_bits: int = 16, flash_attn: str = "auto", swa_full: bool = True):
    """A context for `lanes` sequences of n_ctx tokens, each with its own KV stream; with
    `rope`, its positions stretched (runtime/rope.py). Without, llama.cpp's defaults keep
    the model's own rope settings. `kv_bits` 8 or 4: K and V quantized (q8_0, q4_0), with
    flash attention, which llama.cpp needs for a quantized V.

    `flash_attn`: llama.cpp's flash attention, auto by default as llama-server has it. Its CPU
    kernel computes a sequence's rows differently when fewer than 64 of them run together (a
    prompt's last chunk, a warm prompt's last token), so a prompt's logits depend on how it was
    cut; off, prefill is about 0.75x as fast and the logits still depended on the cut for
    some prompts (issue 37, measured: docs/sessions.md)."""
    cp = ll.llama_context_default_params()
    cp.flash_attn_type = FLASH_ATTN[flash_attn]
    if kv_bits != 16:
        cp.type_k = cp.type_v = KV_TYPES[kv_bits]
        cp.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
    if rope is not None and rope.kind:
        cp.rope_scaling_type = ROPE_TYPES[rope.kind]
    if rope is not None:
        cp.rope_freq_scale = rope.freq_scale  # 0: the model's own
        cp.yarn_orig_ctx = rope.orig_ctx  # 0: the model's trained window
    cp.n_ctx = lanes * n_ctx
    cp.swa_full = swa_full  # False: a sliding-window layer keeps its window only (runtime/memory_fit.py)
    cp.n_batch = batch_tokens
    cp.n_ubatch = min(batch_tokens, 512)
    cp.n_seq_max = lanes
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.kv_unified = False
    cp.no_perf = True
    return cp


SPLIT_MODES = {"none": ll.LLAMA_SPLIT_MODE_NONE, "layer": ll.LLAMA_SPLIT_MODE_LAYER, "row": ll.LLAMA_SPLIT_MODE_ROW}


def model_params(n_cpu_moe: int = 0, gpu_layers: int = 999, devices: tuple[str, ...] = (), split_mode: str = "layer",
                 tensor_split: tuple[float, ...] = ()):
    """llama.cpp model parameters for loading weights here (see extra_buffers_safe): the last
    `gpu_layers` layers on the GPU when the build has one (runtime/offload.py; no-op on a CPU
    build), on `devices` (ggml's names; ("none",): none) split by `split_mode` and
    `tensor_split`; with n_cpu_moe, the mixture-of-experts weights of the first N layers (-1:
    all) in host memory, as llama-server's --n-cpu-moe, for a MoE model whose weights do not
    fit the device."""
    mp = ll.llama_model_default_params()
    mp.n_gpu_layers = gpu_layers
    mp.split_mode = SPLIT_MODES[split_mode]
    if devices:
        from .devices import device_by_name
        _place(mp, [] if devices == ("none",) else [device_by_name(n) for n in devices], tensor_split)
    elif tensor_split:
        _place(mp, None, tensor_split)
    mp.use_extra_bufts = extra_buffers_safe()
    if n_cpu_moe:
        from . import rpc
        layers = r"\d+" if n_cpu_moe < 0 else "|".join(str(i) for i in range(n_cpu_moe))
        pattern = rf"^blk\.({layers})\.ffn_(up|down|gate|gate_up)_(ch|)exps".encode()
        mp._over = (_BuftOverride * 2)(_BuftOverride(pattern, rpc.cpu_buffer_type()), _BuftOverride(None, None))
        mp.tensor_buft_overrides = ctypes.cast(mp._over, ctypes.c_void_p)
    return mp


def split_params(path: str, nodes, split: list[float], output: str = "head"):
    """Model parameters for a GGUF split by layers over this host's CPU and llama.cpp RPC
    nodes (runtime/rpc_link.py): the devices in order, each with its share of the layers;
    the output layer on this host (`output` "head") or on the last node ("last")."""
    from . import rpc
    from .rpc_link import check_fits, shares
    nodes.require()
    devs = [rpc.cpu_device()] + [d for n in nodes.nodes for d in rpc.devices(n.endpoint)]
    offers = [rpc.memory(d) for d in devs]
    parts = shares(offers, split)
    check_fits(os.path.getsize(path), offers, parts, ["this host"] + [n.addr for n in nodes.nodes])
    mp = model_params()
    _place(mp, devs, parts)
    mp.split_mode = ll.LLAMA_SPLIT_MODE_LAYER
    # the output layer on this host, beside the input embedding it often shares: the last
    # node then sends back a hidden state (n_embd floats a token) instead of logits (n_vocab
    # floats, 196 KB a token for the embedded model, through both ends of the tunnel), and
    # holds no copy of a tied embedding. Measured in docs/fleet.md: decode +4-12%.
    if output == "head":
        mp._over = (_BuftOverride * 2)(_BuftOverride(HEAD_TENSORS, rpc.cpu_buffer_type()), _BuftOverride(None, None))
        mp.tensor_buft_overrides = ctypes.cast(mp._over, ctypes.c_void_p)
    return mp


def _place(mp, devs: list | None, split) -> None:
    """The devices the weights go to (None: llama.cpp's choice) and their shares of the layers,
    as arrays kept alive with mp."""
    if devs is not None:
        mp._devices = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)  # NULL-terminated
        mp.devices = ctypes.cast(mp._devices, ctypes.c_void_p)
    if split:
        mp._split = (ctypes.c_float * 128)(*tuple(split)[:128])
        mp.tensor_split = ctypes.cast(mp._split, ctypes.POINTER(ctypes.c_float))


HEAD_TENSORS = rb"^(output|token_embd)\.weight$"  # kept on this host's CPU in a split


class _BuftOverride(ctypes.Structure):
    """llama_model_tensor_buft_override: a tensor-name regex and the buffer type it goes to."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]
