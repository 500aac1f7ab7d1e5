"""The transformers runtime in-process on the embedded model converted from its GGUF: the
conversion is cached and agrees with llama.cpp, greedy lanes (alone or batched with other
prompt lengths) equal a plain `model.generate`, lane copies and truncations continue exactly."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from superfluid.plan import PLACEHOLDER, Copy, LaneOpen, Run, StepPlan  # noqa: E402
from superfluid.request import SamplingParams  # noqa: E402

from . import hf  # noqa: E402

GREEDY = SamplingParams(temperature=0)
N = 16


@pytest.fixture(scope="module")
def rt():
    from superfluid.runtime.transformers import TransformersRuntime

    hf.folder()  # converted into the test home: the runtime below finds it there
    old = os.environ.get("SUPERFLUID_HOME")
    os.environ["SUPERFLUID_HOME"] = str(hf.HOME)
    try:
        r = TransformersRuntime(hf.gguf(), lanes=4, n_ctx=512, threads=1, batch_tokens=256)
    finally:
        if old is None:
            os.environ.pop("SUPERFLUID_HOME")
        else:
            os.environ["SUPERFLUID_HOME"] = old
    yield r
    r.close()


class Stepper:
    def __init__(self, rt):
        self.rt, self.n = rt, 0

    def __call__(self, **kw):
        self.n += 1
        return self.rt.step(StepPlan(self.n, **kw))


def greedy_lanes(rt, prompts: dict[int, list[int]], n: int) -> dict[int, list[int]]:
    """Open each lane, prefill all in one step, then decode all lanes together for n - 1 steps."""
    step = Stepper(rt)
    res = step(opens=tuple(LaneOpen(s, GREEDY) for s in prompts),
               runs=tuple(Run(s, 0, tuple(p), True) for s, p in prompts.items()))
    out = {s.seq: [s.token] for s in res.sampled}
    for i in range(n - 1):
        passes = rt.model.passes
        res = step(runs=tuple(Run(s, len(p) + i, (PLACEHOLDER,), True) for s, p in prompts.items()))
        assert rt.model.passes == passes + 1  # every lane's decode in one batched pass
        for s in res.sampled:
            out[s.seq].append(s.token)
    step(closes=tuple(prompts))
    return out


def test_conversion_is_cached_and_complete():
    from superfluid.runtime.hf_convert import MARKER, hf_dir

    d = hf.folder()
    files = set(os.listdir(d))
    assert {"config.json", "generation_config.json", "model.safetensors", MARKER} <= files
    mtime = os.path.getmtime(os.path.join(d, "model.safetensors"))
    assert str(hf_dir(hf.gguf(), cache=hf.HOME / "models")) == d  # reused, not rebuilt
    assert os.path.getmtime(os.path.join(d, "model.safetensors")) == mtime
    assert hf_dir(d) == type(hf_dir(d))(d)  # an HF folder is served as it is
    assert [n for n in os.listdir(hf.HOME / "models") if n.startswith(".")] == []  # no temp dirs left


def test_logits_agree_with_llamacpp(rt):
    """Dequantized weights (Q/K rows un-permuted, tied head) against llama.cpp on the Q4_1 file:
    same top token, log-probs of the top 5 within Q4_1 kernel noise."""
    from superfluid.codec.tokenizer import Tokenizer
    from superfluid.runtime.llamacpp import LlamaCppRuntime

    tok = Tokenizer(hf.gguf())
    ll = LlamaCppRuntime(hf.gguf(), lanes=1, n_ctx=256, threads=1, batch_tokens=128)
    try:
        for text in ("The quick brown fox", "def fibonacci(n):", "Once upon a time, there was"):
            ids = tuple(tok.encode(text))
            ll.open_lane(0, 0)
            a = ll.forward((Run(0, 0, ids, True),))[0].astype(np.float64)
            rt.open_lane(3, 0)
            b = rt.forward((Run(3, 0, ids, True),))[3].astype(np.float64)
            la, lb = a - np.logaddexp.reduce(a), b - np.logaddexp.reduce(b)
            top = np.argsort(-lb)[:5]
            assert a.argmax() == b.argmax(), text
            assert np.abs(la[top] - lb[top]).max() < 0.35, (text, la[top], lb[top])
    finally:
        ll.close()


def test_info_and_eog(rt):
    assert rt.info.n_vocab == 49152 and rt.info.n_lanes == 4 and rt.info.n_ctx == 512
    assert rt.info.n_ctx_train == 8192
    assert set(rt.eog.tolist()) == set(hf.EOG)
    assert rt.model.n_params == 134_515_008  # the whole model, tied head counted once


def test_greedy_one_lane_equals_generate(rt):
    prompt = hf.chat_prompt("What is the capital of France?")
    ref = hf.generate(prompt, N)
    got = greedy_lanes(rt, {0: prompt}, N)[0]
    assert hf.until_eog(got) == ref


def test_batched_lanes_equal_generate(rt):
    prompts = {0: hf.chat_prompt("Name a color."),
               1: hf.chat_prompt("Write one sentence about the sea and the wind over it."),
               2: [504, 351, 472, 253, 1000]}
    got = greedy_lanes(rt, prompts, N)
    for s, p in prompts.items():
        assert hf.until_eog(got[s]) == hf.generate(p, N), s


def test_copy_and_keep_continue_exactly(rt):
    prompt = hf.chat_prompt("List three rivers.")
    fresh = greedy_lanes(rt, {0: prompt}, 8)[0]
    step = Stepper(rt)
    # lane 1 seeded from lane 0's KV (all but the last prompt token), lane 0 reopened keeping it too
    step(opens=(LaneOpen(1, GREEDY), LaneOpen(0, GREEDY, keep=len(prompt) - 1)),
         copies=(Copy(0, 1, len(prompt) - 1),))
    res = step(runs=(Run(0, len(prompt) - 1, (prompt[-1],), True), Run(1, len(prompt) - 1, (prompt[-1],), True)))
    out = {s.seq: [s.token] for s in res.sampled}
    for i in range(7):
        res = step(runs=(Run(0, len(prompt) + i, (PLACEHOLDER,), True), Run(1, len(prompt) + i, (PLACEHOLDER,), True)))
        for s in res.sampled:
            out[s.seq].append(s.token)
    assert out[0] == fresh and out[1] == fresh


def test_grammar_tokenizer_covers_the_vocab(rt):
    lt = rt.grammar_tokenizer()
    assert lt.vocab_size == rt.info.n_vocab
