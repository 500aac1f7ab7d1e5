#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (the `device` tool's lent H100): build llama.cpp for CUDA as
# install.sh does, serve a model with every layer on the GPU, and print decode and prefill
# against llama-server built from the same llama.cpp source with the same backend
# (bench/offload.py). Usage: bash scripts/gpu-check.sh [GGUF] (default: the embedded model).
set -euo pipefail
cd "$(dirname "$0")/.."
export SUPERFLUID_GPU="${SUPERFLUID_GPU:-cuda}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
./install.sh
python -m superfluid.runtime.devices
# llama-server from the llama.cpp inside llama-cpp-python's source, the same backend options
version=$(python -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))")
src="${TMPDIR:-/tmp}/llama-cpp-python-$version"
if [ ! -d "$src" ]; then
  pip download --no-deps --no-binary :all: -d "${TMPDIR:-/tmp}" "llama-cpp-python==$version"
  tar -xzf "${TMPDIR:-/tmp}/llama_cpp_python-$version.tar.gz" -C "${TMPDIR:-/tmp}"
  mv "${TMPDIR:-/tmp}/llama_cpp_python-$version" "$src"
fi
read -r -a opts <<< "$(bash scripts/llama-cmake-args.sh)"
cmake -S "$src/vendor/llama.cpp" -B "$src/build-server" "${opts[@]}" -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$src/build-server" --target llama-server -j "$CMAKE_BUILD_PARALLEL_LEVEL" >/dev/null
model=()
[ -n "${1:-}" ] && model=(--model "$1")
python bench/offload.py "${model[@]}" --threads "$(nproc)" --llama-server "$src/build-server/bin/llama-server"
