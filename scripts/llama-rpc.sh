#!/usr/bin/env bash
# Make the installed llama-cpp-python one built with llama.cpp's RPC backend (-DGGML_RPC=ON),
# which `serve --rpc-nodes` and `node serve --rpc` need. Idempotent: nothing happens when the
# installed build has it. pip caches a built wheel by its source, not by CMAKE_ARGS, so a
# cached build without RPC would win silently: the RPC build is made once with pip's cache
# off and kept under ~/.cache/superfluid/wheels, where the next run finds it.
set -euo pipefail
if python -c "from superfluid.runtime.rpc import library; library()" 2>/dev/null; then
  exit 0
fi
version=$(python -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))")
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/superfluid/wheels/rpc"
mkdir -p "$wheels"
wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-cpp-python $version with llama.cpp's RPC backend (a few minutes)" >&2
  CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=ON -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    pip wheel --no-cache-dir --no-deps -w "$wheels" "llama-cpp-python==$version"
  wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -n1)
fi
pip install --no-deps --force-reinstall "$wheel"
python -c "from superfluid.runtime.rpc import library; library()"
