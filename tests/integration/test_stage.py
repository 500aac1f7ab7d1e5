"""Staged forward: layer ranges chained in-process give, greedy, exactly the full runtime's
tokens; a stage holds only its range's parameters; decode reuses each stage's KV cache."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from . import hf  # noqa: E402

N = 12


@pytest.fixture(scope="module")
def full():
    from superfluid.runtime.stage import StageModel

    return StageModel(hf.folder(), 0, 30)


def split(bounds):
    from superfluid.runtime.stage import StageModel

    return [StageModel(hf.folder(), a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def chain(stages, items):
    """items: (session, pos, tokens) -> logits per item, through every stage in turn."""
    from superfluid.runtime.stage import StageInput

    xs = [StageInput(s, p, tokens=list(t)) for s, p, t in items]
    for st in stages:
        outs = st.forward(xs)
        if st.is_last:
            return outs
        xs = [StageInput(x.session, x.pos, hidden=h) for x, h in zip(xs, outs, strict=True)]
    raise AssertionError("no last stage")


def greedy(stages, prompts: dict[str, list[int]], n: int) -> dict[str, list[int]]:
    logits = chain(stages, [(s, 0, p) for s, p in prompts.items()])
    out = {s: [int(lg.argmax())] for s, lg in zip(prompts, logits, strict=True)}
    for i in range(n - 1):
        logits = chain(stages, [(s, len(p) + i, [out[s][-1]]) for s, p in prompts.items()])
        for s, lg in zip(prompts, logits, strict=True):
            out[s].append(int(lg.argmax()))
    return out


PROMPTS = {"a": [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
           "b": [504, 351, 472, 253, 1000]}


@pytest.fixture(scope="module")
def reference():
    """The full single-model TransformersRuntime's greedy tokens, lanes batched."""
    from superfluid.plan import PLACEHOLDER, LaneOpen, Run, StepPlan
    from superfluid.request import SamplingParams
    from superfluid.runtime.transformers import TransformersRuntime

    rt = TransformersRuntime(hf.folder(), lanes=2, n_ctx=256, threads=1)
    lanes = dict(enumerate(PROMPTS.values()))
    res = rt.step(StepPlan(1, opens=tuple(LaneOpen(s, SamplingParams(temperature=0)) for s in lanes),
                           runs=tuple(Run(s, 0, tuple(p), True) for s, p in lanes.items())))
    out = {s.seq: [s.token] for s in res.sampled}
    for i in range(N - 1):
        res = rt.step(StepPlan(2 + i, runs=tuple(Run(s, len(p) + i, (PLACEHOLDER,), True) for s, p in lanes.items())))
        for s in res.sampled:
            out[s.seq].append(s.token)
    rt.close()
    return {name: out[i] for i, name in enumerate(PROMPTS)}


@pytest.mark.parametrize("bounds", [(0, 13, 30), (0, 7, 20, 30)], ids=["2-stage", "3-stage"])
def test_split_equals_full_runtime(bounds, reference, full):
    stages = split(bounds)
    assert greedy(stages, PROMPTS, N) == reference
    assert greedy([full], PROMPTS, N) == reference
    # a stage holds only its range: the sum over stages is the whole model, plus the tied
    # embedding a second time (first stage's input embedding, last stage's output head)
    tied = full.n_vocab * full.hidden_size
    assert sum(s.n_params for s in stages) == full.n_params + tied
    per_layer = (full.n_params - tied - full.hidden_size) // 30  # minus embedding and final norm
    for s in stages:
        assert len(s.layers) == s.last - s.first
        extra = (tied if s.is_first else 0) + (tied + full.hidden_size if s.is_last else 0)
        assert s.n_params == (s.last - s.first) * per_layer + extra
    mid = stages[1] if len(stages) == 3 else None
    if mid is not None:
        assert mid.embed is None and mid.lm_head is None and mid.norm is None
        assert not mid.is_first and not mid.is_last


def test_decode_reuses_kv(full):
    """After a long context, a decode step feeds one token per session through the layers, in
    one batched pass, whatever the context length."""
    from superfluid.runtime.stage import StageInput

    rng = np.random.default_rng(0)
    ctx = {s: rng.integers(100, 40000, size=n).tolist() for s, n in (("long", 300), ("short", 20))}
    for s, toks in ctx.items():
        full.forward([StageInput(s, 0, tokens=toks)])
    fed, passes = full.tokens_fed, full.passes
    lg = full.forward([StageInput(s, len(t), tokens=[7]) for s, t in ctx.items()])
    assert full.tokens_fed == fed + 2 and full.passes == passes + 1
    assert full.cached("long") == 301 and full.cached("short") == 21
    # a re-sent item (pos below the cache) truncates first: same logits, same length
    again = full.forward([StageInput("long", 300, tokens=[7])])
    assert full.cached("long") == 301
    np.testing.assert_allclose(again[0], lg[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError):
        full.forward([StageInput("long", 305, tokens=[7])])
    n = full.sessions()
    full.drop("long")
    full.drop("short")
    assert full.sessions() == n - 2


def test_middle_stage_takes_hidden_states():
    from superfluid.runtime.stage import StageInput, StageModel

    mid = StageModel(hf.folder(), 10, 12)
    h = np.random.default_rng(1).standard_normal((5, mid.hidden_size)).astype(np.float32)
    out = mid.forward([StageInput("s", 0, hidden=h)])
    assert out[0].shape == (5, mid.hidden_size) and out[0].dtype == np.float32
    # the same rows fed in two pieces give the same states (the KV of the first piece is used)
    mid.drop("s")
    a = mid.forward([StageInput("s", 0, hidden=h[:3])])[0]
    b = mid.forward([StageInput("s", 3, hidden=h[3:])])[0]
    np.testing.assert_allclose(np.concatenate([a, b]), out[0], rtol=1e-4, atol=1e-4)


def test_a_stage_reads_only_its_layers_from_the_gguf_in_place():
    """A stage built straight from the GGUF (no float32 copy of the whole model) holds the
    same weights and computes the same activations as one built from the converted folder."""
    import torch

    from superfluid.runtime.stage import StageInput, StageModel

    a, b = StageModel(hf.gguf(), 10, 20), StageModel(hf.folder(), 10, 20)
    pa, pb = dict(a.layers.named_parameters()), dict(b.layers.named_parameters())
    assert pa.keys() == pb.keys() and a.n_params == b.n_params and a.embed is None and a.lm_head is None
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    h = np.random.default_rng(0).standard_normal((5, a.hidden_size)).astype(np.float32)
    (x,), (y,) = a.forward([StageInput("s", 0, hidden=h)]), b.forward([StageInput("s", 0, hidden=h)])
    assert np.array_equal(x, y)
