"""The llama.cpp the tests run on is the build install.sh makes for this machine
(scripts/llama-cmake-args.sh's options: the GPU backend scripts/gpu-detect.sh picks, the RPC
backend, no OpenMP, the CPU's instruction sets named), and the daemon says so first."""

import subprocess
from pathlib import Path

from superfluid.runtime import devices

ROOT = Path(__file__).resolve().parents[2]


def test_the_loaded_library_has_the_options_install_sh_builds():
    r = subprocess.run(["bash", str(ROOT / "scripts/llama-build.sh"), "--check"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    gpu = subprocess.run(["bash", str(ROOT / "scripts/gpu-detect.sh")], capture_output=True, text=True,
                         timeout=60).stdout.strip()
    names = devices.backends()
    assert "RPC" in names and "CPU" in names
    want = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "metal": "Metal"}.get(gpu)
    assert want is None or want in names, (gpu, names)


def test_an_unknown_gpu_choice_is_refused():
    r = subprocess.run(["bash", str(ROOT / "scripts/gpu-detect.sh")], capture_output=True, text=True, timeout=60,
                       env={"SUPERFLUID_GPU": "quantum", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "expected cuda, rocm, vulkan, metal or cpu" in r.stderr
