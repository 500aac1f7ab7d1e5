#!/usr/bin/env bash
# The CMake options superfluid builds llama.cpp with (through llama-cpp-python), for this
# machine; .ci/run, the README's install line and scripts/llama-build.sh take them from here.
#   -DGGML_RPC=ON       llama.cpp's RPC backend (serve --rpc-nodes, node serve --rpc)
#   -DLLAVA_BUILD=OFF   no multimodal library (a third of the build)
#   -DGGML_OPENMP=OFF   ggml's own threadpool, faster than OpenMP's (docs/performance.md)
# On x86-64, the instruction sets this CPU has, named one by one, instead of GGML_NATIVE
# (-march=native): on the Xeon test machines the native build decodes 25-35% slower than
# the same sets named (docs/performance.md, "Instruction sets"). AMX is left out: its kernels
# fault in VMs that advertise it, and superfluid keeps them off there (extra_buffers_safe).
# The GPU backend: the one scripts/gpu-detect.sh picks (SUPERFLUID_GPU overrides it):
#   cuda -DGGML_CUDA=ON, for the GPUs' own architectures (nvidia-smi's compute capability;
#        llama.cpp's default list of every architecture takes an hour to build); rocm
#        -DGGML_HIP=ON; vulkan -DGGML_VULKAN=ON (with Debian 13's headers where the system's are
#        too old: scripts/vulkan-headers.sh); metal -DGGML_METAL=ON; cpu: none.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
args="-DGGML_RPC=ON -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF"
gpu="$(bash "$here/gpu-detect.sh")"
case "$gpu" in
  cuda)
    args="$args -DGGML_CUDA=ON"
    caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | sort -u | paste -sd';' || true)
    [ -n "$caps" ] && args="$args -DCMAKE_CUDA_ARCHITECTURES=$caps"
    ;;
  rocm) args="$args -DGGML_HIP=ON" ;;
  vulkan)
    args="$args -DGGML_VULKAN=ON"
    vk="$(bash "$here/vulkan-headers.sh")"  # newer headers where the system's are too old
    [ -n "$vk" ] && args="$args -DVulkan_INCLUDE_DIR=$vk/include -DCMAKE_PREFIX_PATH=$vk"
    ;;
  metal) args="$args -DGGML_METAL=ON" ;;
esac
if [ "$(uname -m)" = x86_64 ] && [ -r /proc/cpuinfo ]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  # want OPTION CPU-FLAG...: -DGGML_OPTION=ON when the CPU has every flag named
  want() {
    local opt=$1 f
    shift
    for f in "$@"; do
      [[ "$flags" == *" $f "* ]] || return 0
    done
    args="$args -DGGML_$opt=ON"
  }
  args="$args -DGGML_NATIVE=OFF"
  want AVX avx
  want AVX2 avx2
  want FMA fma
  want F16C f16c
  want BMI2 bmi2
  want AVX_VNNI avx_vnni
  want AVX512 avx512f avx512bw avx512dq avx512vl avx512cd
  want AVX512_VBMI avx512f avx512bw avx512dq avx512vl avx512cd avx512vbmi
  want AVX512_VNNI avx512f avx512bw avx512dq avx512vl avx512cd avx512_vnni
  want AVX512_BF16 avx512f avx512bw avx512dq avx512vl avx512cd avx512_bf16
fi
echo "$args"
