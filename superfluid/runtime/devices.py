"""What the installed llama.cpp was built for and the devices it sees, through ggml's backend
registry (llama-cpp-python binds none of it): the backends compiled in (CPU, CUDA, Vulkan,
Metal, RPC...), the CPU's instruction sets, and each device with its free and total memory
(`ggml_backend_dev_memory`, what the window and layers are fitted to). `superfluid serve` says
the build in its first line and warns when the machine has a GPU the build cannot use
(install.sh picks the build: docs/gpu.md)."""

from __future__ import annotations

import ctypes
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll

from ..codec.tokenizer import quiet_llama_logs
from ..errors import ModelLoadError
from .ggml_libs import loaded

KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}  # enum ggml_backend_dev_type
GPU_BACKENDS = {"CUDA", "ROCm", "HIP", "Vulkan", "Metal", "SYCL", "MUSA", "CANN", "OpenCL"}  # ggml's reg names


@dataclass(frozen=True)
class Device:
    name: str  # ggml's: CPU, CUDA0, Vulkan0, RPC[host:port]...
    description: str  # the hardware: "NVIDIA H100 80GB HBM3", "llvmpipe (LLVM 15.0.6, 256 bits)"
    kind: str  # cpu, gpu, igpu, accel
    free: int  # bytes
    total: int

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description, "kind": self.kind, "free_bytes": self.free,
                "total_bytes": self.total}


@functools.cache
def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    quiet_llama_logs()  # before ggml registers its backends: ggml-vulkan says what it finds
    base = ctypes.CDLL(str(loaded("libggml-base")))
    ggml = ctypes.CDLL(str(loaded("libggml")))
    ll.llama_backend_init()  # registers the compiled-in backends
    for lib, name, args, res in (
            (ggml, "ggml_backend_reg_count", [], ctypes.c_size_t),
            (ggml, "ggml_backend_reg_get", [ctypes.c_size_t], ctypes.c_void_p),
            (ggml, "ggml_backend_dev_count", [], ctypes.c_size_t),
            (ggml, "ggml_backend_dev_get", [ctypes.c_size_t], ctypes.c_void_p),
            (ggml, "ggml_backend_dev_by_name", [ctypes.c_char_p], ctypes.c_void_p),
            (base, "ggml_backend_reg_name", [ctypes.c_void_p], ctypes.c_char_p),
            (base, "ggml_backend_dev_name", [ctypes.c_void_p], ctypes.c_char_p),
            (base, "ggml_backend_dev_description", [ctypes.c_void_p], ctypes.c_char_p),
            (base, "ggml_backend_dev_type", [ctypes.c_void_p], ctypes.c_int),
            (base, "ggml_backend_dev_memory", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                               ctypes.POINTER(ctypes.c_size_t)], None)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return base, ggml


def backends() -> list[str]:
    """The backends this build registered, in ggml's order (the GPU ones before the CPU)."""
    base, ggml = _libs()
    return [(base.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)) or b"?").decode()
            for i in range(ggml.ggml_backend_reg_count())]


def devices() -> list[Device]:
    """Every device ggml sees now (memory as of this call)."""
    base, ggml = _libs()
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Device((base.ggml_backend_dev_name(dev) or b"?").decode(),
                          (base.ggml_backend_dev_description(dev) or b"").decode(errors="replace").strip(),
                          KINDS.get(base.ggml_backend_dev_type(dev), "other"), free.value, total.value))
    return out


def device_by_name(name: str) -> int:
    """ggml's device handle by its name (CUDA0, Vulkan0); ModelLoadError naming the ones it has."""
    dev = _libs()[1].ggml_backend_dev_by_name(name.encode())
    if not dev:
        seen = ", ".join(d.name for d in devices())
        raise ModelLoadError(f"--device {name}: no such device (this build sees {seen})")
    return dev


def cpu_features() -> list[str]:
    """The CPU backend's instruction sets (llama.cpp's system info: AVX2, FMA, ...)."""
    info = ll.llama_print_system_info().decode(errors="replace")
    cpu = info.split("CPU :", 1)[1].split("|  ", 1)[0] if "CPU :" in info else info
    return [k for k, v in re.findall(r"(\w+) = (\d)", cpu) if v == "1"]


def machine_gpus() -> list[str]:
    """The GPUs this machine has, by their device files, whatever the build: NVIDIA's, AMD's
    compute device (ROCm), a render node (any GPU with a Vulkan or OpenGL driver)."""
    found = []
    if any(Path("/dev").glob("nvidia[0-9]*")):
        found.append("an NVIDIA GPU (/dev/nvidia*)")
    if Path("/dev/kfd").exists():
        found.append("an AMD GPU (/dev/kfd)")
    elif any(Path("/dev/dri").glob("renderD*")) and not found:
        found.append("a GPU render node (/dev/dri)")
    return found


def missing_gpu_line(build: Build) -> str | None:
    """A warning when the machine has a GPU and the build cannot use one (SUPERFLUID_GPU=cpu
    says the CPU build was chosen: no warning then)."""
    if build.offload or os.environ.get("SUPERFLUID_GPU", "") == "cpu":
        return None
    gpus = machine_gpus()
    if not gpus:
        return None
    return (f"this machine has {gpus[0]} but llama.cpp was built for the CPU only: "
            f"run ./install.sh to build it for the GPU (docs/gpu.md)")


@dataclass(frozen=True)
class Build:
    """What a probe found: the build's backends, the CPU's instruction sets, the devices."""
    version: str
    backends: tuple[str, ...]
    cpu: tuple[str, ...]
    devices: tuple[Device, ...]

    @property
    def offload(self) -> list[Device]:
        return [d for d in self.devices if d.kind in ("gpu", "igpu")]

    def line(self) -> str:
        where = ", ".join(f"{d.name} {d.description} ({d.free / 2**30:.1f} of {d.total / 2**30:.1f} GiB free)"
                          for d in self.offload) or "the CPU only"
        return (f"llama.cpp {self.version}: backends {', '.join(self.backends)}; "
                f"CPU {' '.join(self.cpu) or '(baseline)'}; layers on {where}")

    def to_json(self) -> dict:
        return {"version": self.version, "backends": list(self.backends), "cpu": list(self.cpu),
                "devices": [d.to_json() for d in self.devices]}


def here() -> Build:
    return Build(ll.__version__, tuple(backends()), tuple(cpu_features()), tuple(devices()))


def probe(timeout: float = 60.0) -> Build:
    """The build and devices, asked of a short-lived process: a GPU backend's context (a CUDA
    context holds a few hundred MB of the device) then lives only in the workers that use it,
    not in the daemon for its whole life. The daemon's own reading when the probe fails."""
    import json
    import subprocess
    import sys
    try:
        out = subprocess.run([sys.executable, "-m", "superfluid.runtime.devices", "--json"], capture_output=True,
                             timeout=timeout, check=True, text=True).stdout
        b = json.loads(out.strip().splitlines()[-1])
        return Build(b["version"], tuple(b["backends"]), tuple(b["cpu"]),
                     tuple(Device(d["name"], d["description"], d["kind"], d["free_bytes"], d["total_bytes"])
                           for d in b["devices"]))
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError):
        return here()


if __name__ == "__main__":  # install.sh's last line: the build just installed; --json: probe()'s answer
    import json
    import sys
    if "--json" in sys.argv:
        print(json.dumps(here().to_json()))
    else:
        build = here()
        print(build.line())
        said = missing_gpu_line(build)
        if said:
            print(f"warning: {said}")
