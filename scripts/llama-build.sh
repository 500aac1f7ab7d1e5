#!/usr/bin/env bash
# Make the installed llama-cpp-python the build superfluid wants (scripts/llama-cmake-args.sh):
# the GPU backend scripts/gpu-detect.sh picks (SUPERFLUID_GPU overrides it); llama.cpp's RPC
# backend, which `serve --rpc-nodes` and `node serve --rpc` need; ggml's own threadpool
# instead of OpenMP; on x86-64 the CPU's instruction sets named one by one instead of
# -march=native. Options in $CMAKE_ARGS come after those and win. Idempotent: nothing happens
# when the installed build is that one. pip caches a built wheel by its source, not by
# CMAKE_ARGS, so a cached build without them would win silently: this build is made once with
# pip's cache off and kept under ~/.cache/superfluid/wheels/<options>, where the next run (and
# a fresh checkout's install.sh) finds it. --check: build nothing, fail when the installed build
# is not that one (tests/integration/test_build.py). install.sh runs it before superfluid's own install,
# so pip never builds llama.cpp with its default options first.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
args="$(bash "$here/llama-cmake-args.sh") ${CMAKE_ARGS:-}"
wanted() {
  PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}" LLAMA_WANTED="$args" python - <<'PY'
import ctypes, os, re, sys
from superfluid.runtime.ggml_libs import lib_dir
from superfluid.runtime.rpc import library
library()  # raises without the RPC backend
cpu = ctypes.CDLL(str(lib_dir() / "libggml-cpu.so.0"))
opts = dict(re.findall(r"-DGGML_(\w+)=(\w+)", os.environ["LLAMA_WANTED"]))  # the last of each wins
for opt, lib in (("CUDA", "libggml-cuda"), ("HIP", "libggml-hip"), ("VULKAN", "libggml-vulkan"),
                 ("METAL", "libggml-metal")):
    if opts.get(opt, "OFF").upper() == "ON" and not (lib_dir() / f"{lib}.so").exists():
        sys.exit(f"llama.cpp is built without its {opt} backend")
if opts.get("OPENMP", "ON").upper() == "OFF" and hasattr(cpu, "GOMP_parallel"):
    sys.exit("llama.cpp is linked to OpenMP")
if opts.get("NATIVE", "ON").upper() == "OFF":  # the instruction sets named: exactly those
    import llama_cpp
    info = llama_cpp.llama_print_system_info().decode()
    sets = {"AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
            "AVX512_BF16", "AMX_INT8", "AMX_BF16"}
    have = {k for k, v in re.findall(r"(\w+) = (\d)", info) if v == "1" and k in sets}
    want = {k for k, v in opts.items() if v.upper() == "ON" and k in sets}
    if have != want:
        sys.exit(f"llama.cpp is built for {sorted(have)}, not {sorted(want)}")
PY
}
if [ "${1:-}" = --check ]; then  # only say whether the installed build is the one wanted
  wanted
  exit
fi
if wanted 2>/dev/null; then
  exit 0
fi
version=$(python -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))")
key=$(echo "$args" | tr -s ' ' '\n' | sort -u | sha256sum | cut -c1-12)
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/superfluid/wheels/$key"
mkdir -p "$wheels"
echo "$args" > "$wheels/CMAKE_ARGS"
wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-cpp-python $version with CMAKE_ARGS=$args (a few minutes)" >&2
  CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    pip wheel --no-cache-dir --no-deps -w "$wheels" "llama-cpp-python==$version"
  wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -n1)
fi
pip install --no-deps --force-reinstall "$wheel"
pip install "$wheel"  # what it needs (numpy, jinja2...) on a fresh machine; the wheel itself is in
wanted
