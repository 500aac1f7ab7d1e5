"""How much of a model goes to the GPU (--gpu-layers auto|all|N, llama-server's -ngl; its --fit).

`auto`, the default, fits into the offload devices' free memory (ggml_backend_dev_memory, read
by runtime/devices.probe) less a margin for compute buffers: first the weights and every lane's
window of KV (runtime/memory_fit.py's costs); where they do not fit and no --max-context was
asked, the window shrinks, down to 4096 tokens; then layers spill to the CPU, the last ones
first (llama.cpp offloads the last n_gpu_layers), each with its share of the weights and its
KV. A machine without an offload device (a CPU build) has nothing to decide."""

from __future__ import annotations

from dataclasses import dataclass

from .devices import Build, Device
from .memory_fit import Fit

MARGIN = 1 << 30  # a device's room kept for compute buffers and the backend's own (llama-server's --fit-target)
MIN_WINDOW = 4096  # auto shrinks the window no further before it spills layers


@dataclass(frozen=True)
class Offload:
    layers: int  # llama.cpp's n_gpu_layers: 0 none; n_layer + 1 every layer and the output
    n_ctx: int  # the window, shrunk to fit the device where none was asked
    devices: tuple[str, ...]  # ggml's names of the devices used (() : llama.cpp's choice, or none)
    line: str  # what was chosen, for the startup line ("" without an offload device)
    device_bytes: int = 0  # what the weights and KV on the devices take (Ollama's size_vram)
    whole: int = 0  # the model's layers and its output layer
    total_bytes: int = 0  # the devices' memory

    def to_json(self) -> dict:
        """The capability record's and /health's `device`."""
        if not self.layers:
            return {"devices": ["CPU"], "layers": 0}
        return {"devices": list(self.devices), "layers": min(self.layers, self.whole), "of": self.whole,
                "bytes": self.device_bytes, "total_bytes": self.total_bytes}


def parse_layers(value: str) -> str:
    """--gpu-layers' value: auto, all, or a number of layers (llama-server's -1 and 999: all)."""
    v = value.strip().lower()
    if v in ("auto", "all"):
        return v
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"expected auto, all or a number of layers, got {value!r}") from None
    if n < -1:
        raise ValueError("must be at least -1 (-1: all)")
    return "all" if n == -1 else str(n)


def plan(build: Build, *, gpu_layers: str, names: tuple[str, ...], n_layer: int, model_bytes: int, fit: Fit,
         lanes: int, requested: int | None) -> Offload:
    """The layers and window for this model on the build's offload devices (`names`: the ones
    --device named, else all of them)."""
    devs = _chosen(build, names)
    if not devs or gpu_layers == "0" or n_layer <= 0:
        return Offload(0, fit.n_ctx, (), "")
    whole = n_layer + 1  # the output layer counts as one more
    free = max(0, sum(d.free for d in devs) - MARGIN * len(devs))

    def kv(ctx: int) -> int:
        return lanes * (ctx * fit.token_bytes + fit.lane_bytes)

    n_ctx = fit.n_ctx
    if gpu_layers == "all":
        layers = whole
    elif gpu_layers != "auto":
        layers = min(whole, int(gpu_layers))
    elif model_bytes + kv(n_ctx) <= free:
        layers = whole
    else:
        if requested is None and n_ctx > MIN_WINDOW:  # a shorter window before layers leave the device
            room = free - model_bytes - lanes * fit.lane_bytes
            n_ctx = max(MIN_WINDOW, min(n_ctx, room // max(1, lanes * fit.token_bytes) // 256 * 256))
        if model_bytes + kv(n_ctx) <= free:
            layers = whole
        else:
            per_layer = (model_bytes + kv(n_ctx)) / whole
            layers = max(0, min(whole - 1, int(free // per_layer)))
    on = (model_bytes + kv(n_ctx)) * min(layers, whole) // whole
    where = " + ".join(d.name for d in devs)
    line = (f"{where} ({sum(d.free for d in devs) / 2**30:.1f} GiB free): {min(layers, whole)} of {whole} layers "
            f"and their KV on it ({on / 2**30:.1f} GiB), window {n_ctx} x {lanes} lanes"
            + ("" if layers >= whole else "; the rest on the CPU"))
    return Offload(layers, n_ctx, tuple(d.name for d in devs), line, on, whole, sum(d.total for d in devs))


def _chosen(build: Build, names: tuple[str, ...]) -> list[Device]:
    if names == ("none",):
        return []
    if not names:
        return build.offload
    by_name = {d.name.lower(): d for d in build.devices}
    missing = [n for n in names if n.lower() not in by_name]
    if missing:
        seen = ", ".join(d.name for d in build.devices)
        raise ValueError(f"--device {','.join(missing)}: no such device (this build sees {seen})")
    chosen = [by_name[n.lower()] for n in names]
    cpu = [d.name for d in chosen if d.kind not in ("gpu", "igpu")]
    if cpu:
        raise ValueError(f"--device {','.join(cpu)}: not a GPU (layers stay on the CPU without --device: "
                         f"--device none)")
    return chosen
