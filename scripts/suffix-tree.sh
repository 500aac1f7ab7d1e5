#!/usr/bin/env bash
# Arctic Inference's suffix tree for --speculative suffix (superfluid/runtime/suffix.py): a C++
# extension, built here in seconds against the torch already installed ('.[hf]'). Without
# build isolation: with it, pip would fetch a CUDA torch for the build. Idempotent.
set -euo pipefail
if python -c "import arctic_inference.suffix_decoding._C" 2>/dev/null; then
  exit 0
fi
pip install nanobind==2.9.2 ninja cmake grpcio-tools wheel
pip install --no-build-isolation arctic-inference==0.3.0
