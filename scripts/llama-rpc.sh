#!/usr/bin/env bash
# Make the installed llama-cpp-python the build superfluid wants: llama.cpp's RPC backend
# (-DGGML_RPC=ON), which `serve --rpc-nodes` and `node serve --rpc` need, and ggml's own
# threadpool instead of OpenMP (-DGGML_OPENMP=OFF), which decodes 25-45% faster on a quiet
# machine (docs/performance.md). Idempotent: nothing happens when the installed build is
# that one. pip caches a built wheel by its source, not by CMAKE_ARGS, so a cached build
# without them would win silently: this build is made once with pip's cache off and kept
# under ~/.cache/superfluid/wheels, where the next run finds it.
set -euo pipefail
wanted() {
  python - <<'PY'
import ctypes, sys
from superfluid.runtime.rpc import library, lib_dir
library()  # raises without the RPC backend
cpu = ctypes.CDLL(str(lib_dir() / "libggml-cpu.so.0"))
sys.exit(1 if hasattr(cpu, "GOMP_parallel") else 0)  # linked to OpenMP
PY
}
if wanted 2>/dev/null; then
  exit 0
fi
version=$(python -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))")
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/superfluid/wheels/rpc-noomp"
mkdir -p "$wheels"
wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-cpp-python $version with llama.cpp's RPC backend and without OpenMP (a few minutes)" >&2
  CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=ON -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    pip wheel --no-cache-dir --no-deps -w "$wheels" "llama-cpp-python==$version"
  wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -n1)
fi
pip install --no-deps --force-reinstall "$wheel"
wanted
