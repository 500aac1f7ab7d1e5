#!/usr/bin/env bash
# The accelerator llama.cpp should be built for on this machine: cuda, rocm, vulkan, metal or
# cpu (printed). SUPERFLUID_GPU, when set, decides instead. A GPU found without the toolkit
# that builds for it is said on stderr (what to install: docs/gpu.md), and the CPU is picked.
# Only a real GPU picks Vulkan: Mesa's lavapipe (a Vulkan device on the CPU, for tests) is
# taken only with SUPERFLUID_GPU=vulkan.
set -euo pipefail
if [ -n "${SUPERFLUID_GPU:-}" ]; then
  case "$SUPERFLUID_GPU" in
    cuda|rocm|vulkan|metal|cpu) echo "$SUPERFLUID_GPU"; exit 0 ;;
    *) echo "SUPERFLUID_GPU=$SUPERFLUID_GPU: expected cuda, rocm, vulkan, metal or cpu" >&2; exit 2 ;;
  esac
fi
have() { command -v "$1" >/dev/null 2>&1; }
if [ "$(uname -s)" = Darwin ]; then
  [ "$(uname -m)" = arm64 ] && echo metal || echo cpu
  exit 0
fi
if compgen -G "/dev/nvidia[0-9]*" >/dev/null || have nvidia-smi; then
  if have nvcc || [ -x /usr/local/cuda/bin/nvcc ]; then echo cuda; exit 0; fi
  echo "an NVIDIA GPU without the CUDA toolkit (nvcc): building for the CPU; install the toolkit for the GPU (docs/gpu.md)" >&2
fi
if [ -e /dev/kfd ]; then
  if have hipcc || [ -x /opt/rocm/bin/hipcc ]; then echo rocm; exit 0; fi
  echo "an AMD GPU without ROCm (hipcc): trying Vulkan, else the CPU (docs/gpu.md)" >&2
fi
if compgen -G "/dev/dri/renderD*" >/dev/null; then
  if have glslc && [ -f /usr/include/vulkan/vulkan.h ]; then echo vulkan; exit 0; fi
  echo "a GPU without Vulkan's headers and shader compiler (libvulkan-dev, glslc): building for the CPU (docs/gpu.md)" >&2
fi
echo cpu
