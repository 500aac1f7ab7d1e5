"""The memory fit's shape of each model family (runtime/memory_fit.py, read from the GGUF
header) against what llama.cpp itself keeps for a lane: the bytes a token adds to a lane's
saved state, and the size of its recurrent part (a state checkpoint). A family whose layers
the fit miscounted would get a window that does not fit, or one needlessly short."""

from __future__ import annotations


import llama_cpp as ll
import numpy as np
import pytest

from .families import FAMILIES, family_gguf
from superfluid.plan import Run
from superfluid.runtime.checkpoints import PARTIAL
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.memory_fit import MemoryShape, costs, fit


def _state_size(rt, seq: int, flags: int = 0) -> int:
    return ll.llama_state_seq_get_size_ext(rt.ctx, seq, flags)


def _prefill(rt, seq: int, toks: list[int]) -> None:
    for i in range(0, len(toks), 256):
        rt.forward((Run(seq=seq, pos=i, tokens=tuple(toks[i:i + 256]), sample=False),))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_shape_is_what_llamacpp_keeps(name):
    path = family_gguf(name)
    shape = MemoryShape.of_gguf(path, 0)
    toks = [int(t) for t in np.random.default_rng(1).integers(100, 40000, 400)]
    rt = LlamaCppRuntime(path, lanes=2, n_ctx=1024, threads=2, batch_tokens=512)
    try:
        # a sliding window's state is saved without the cells outside it: both under the tiny ones' 128
        _prefill(rt, 0, toks[:40])
        _prefill(rt, 1, toks[:100])
        per_token = (_state_size(rt, 1) - _state_size(rt, 0)) / 60
        # a saved token is its K and V in every attention layer, plus its position and sequence in each cache
        assert shape.full_token + shape.swa_token <= per_token <= shape.full_token + shape.swa_token + 32, \
            (per_token, shape)
        if rt.memory in ("recurrent", "hybrid"):
            partial = _state_size(rt, 0, PARTIAL)  # the recurrent layers' state: one checkpoint
            assert shape.state <= partial <= shape.state * 1.01 + 4096, (partial, shape)
        else:
            assert shape.state == 0
        assert (shape.n_swa > 0) == (rt.memory == "swa")
    finally:
        rt.close()


def test_a_sliding_window_model_short_of_memory_keeps_its_window_only():
    shape = MemoryShape.of_gguf(family_gguf("gptoss"), 0)  # half its layers attend to 128 positions
    full_token, _ = costs(shape, 16, "full")
    args = dict(requested=None, n_ctx_train=131072, lanes=4, kv_bits=16, model_bytes=0)
    roomy = fit(shape, mem_bytes=2 * 4 * 131072 * full_token + (1 << 20), **args)
    assert (roomy.swa_cache, roomy.n_ctx) == ("full", 131072)
    short = fit(shape, mem_bytes=2 * 4 * 16384 * full_token, **args)
    assert short.swa_cache == "window" and short.n_ctx > 16384  # the window layers no longer grow with it
    assert fit(shape, mem_bytes=2 * 4 * 16384 * full_token, swa_cache="full", **args).n_ctx == 16384
    # speculation takes back rejected drafts, which a window-sized cache cannot
    assert fit(shape, mem_bytes=2 * 4 * 16384 * full_token, rollback=True, **args).swa_cache == "full"
