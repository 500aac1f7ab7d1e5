"""The llama.cpp runtime in-process on the embedded model: batched lanes are independent,
a copied lane continues exactly like a freshly prefilled one, chunking does not matter."""

import pytest

from superfluid.codec.template import ChatTemplate
from superfluid.codec.tokenizer import Tokenizer
from superfluid.plan import PLACEHOLDER, Copy, LaneOpen, Run, StepPlan
from superfluid.request import SamplingParams
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.registry import embedded_model

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def rt():
    r = LlamaCppRuntime(embedded_model().path, lanes=4, n_ctx=512, threads=1, batch_tokens=128)
    yield r
    r.close()


@pytest.fixture(scope="module")
def prompt():
    tok = Tokenizer(embedded_model().path)
    text = ChatTemplate(tok.chat_template).render([{"role": "user", "content": "List three rivers."}])
    return tok.encode_prompt(text)


class Stepper:
    def __init__(self, rt):
        self.rt, self.n = rt, 0

    def __call__(self, **kw):
        self.n += 1
        return self.rt.step(StepPlan(self.n, **kw))


def greedy(rt, seq, prompt, n, *, chunk=None):
    step = Stepper(rt)
    chunk = chunk or len(prompt)
    step(opens=(LaneOpen(seq, GREEDY),))
    out = []
    for i in range(0, len(prompt), chunk):
        part = prompt[i:i + chunk]
        r = step(runs=(Run(seq, i, tuple(part), i + len(part) == len(prompt)),))
    out.append(r.sampled[0].token)
    while len(out) < n:
        r = step(runs=(Run(seq, len(prompt) + len(out) - 1, (PLACEHOLDER,), True),))
        out.append(r.sampled[0].token)
    step(closes=(seq,))
    return out


def test_chunked_prefill_gives_the_same_tokens(rt, prompt):
    assert greedy(rt, 0, prompt, 12) == greedy(rt, 1, prompt, 12, chunk=7)


def test_copied_lane_continues_like_a_fresh_one(rt, prompt):
    want = greedy(rt, 0, prompt, 10)
    step = Stepper(rt)
    step(opens=(LaneOpen(0, GREEDY),), runs=(Run(0, 0, tuple(prompt), False),))
    # lane 2 gets all but the last 5 prompt tokens by copy, then prefills only those 5
    k = len(prompt) - 5
    step(opens=(LaneOpen(2, GREEDY),), copies=(Copy(0, 2, k),))
    r = step(runs=(Run(2, k, tuple(prompt[k:]), True),))
    out = [r.sampled[0].token]
    while len(out) < 10:
        r = step(runs=(Run(2, len(prompt) + len(out) - 1, (PLACEHOLDER,), True),))
        out.append(r.sampled[0].token)
    step(closes=(0, 2))
    assert out == want


def test_lanes_in_one_batch_match_lanes_alone(rt, prompt):
    other = prompt[:-3] + prompt[-3:][::-1]
    alone = [greedy(rt, 0, p, 8) for p in (prompt, other)]
    step = Stepper(rt)
    r = step(opens=(LaneOpen(1, GREEDY), LaneOpen(3, GREEDY)),
             runs=(Run(1, 0, tuple(prompt), True), Run(3, 0, tuple(other), True)))
    outs = {s.seq: [s.token] for s in r.sampled}
    while len(outs[1]) < 8:
        r = step(runs=tuple(Run(q, len(p) + len(outs[q]) - 1, (PLACEHOLDER,), True)
                            for q, p in ((1, prompt), (3, other))))
        for s in r.sampled:
            outs[s.seq].append(s.token)
    step(closes=(1, 3))
    assert [outs[1], outs[3]] == alone


def test_runs_enter_the_batch_by_sequence_whatever_the_plan_order(rt, prompt):
    # llama.cpp computes only consecutive, increasing sequence ids together (one graph compute
    # per group): runs planned as 2, 0, 1 must reach llama_decode as 0, 1, 2
    step = Stepper(rt)
    r = step(opens=tuple(LaneOpen(q, GREEDY) for q in (2, 0, 1)),
             runs=tuple(Run(q, 0, tuple(prompt), True) for q in (2, 0, 1)))
    n = len(prompt)
    assert [rt.batch.seq_id[i][0] for i in range(3 * n)] == [0] * n + [1] * n + [2] * n
    assert len({s.token for s in r.sampled}) == 1 and {s.seq for s in r.sampled} == {0, 1, 2}
    step(closes=(0, 1, 2))


# -- the disk tier: a restored lane continues exactly like a freshly prefilled one ----------


@pytest.fixture
def long_prompt():
    tok = Tokenizer(embedded_model().path)
    words = " ".join(f"river{i} stone lantern" for i in range(60))
    text = ChatTemplate(tok.chat_template).render([{"role": "user", "content": f"Summarise: {words}"}])
    p = tok.encode_prompt(text)
    assert 200 < len(p) < 500
    return p


def continue_greedy(step, seq, prompt, start, n, chunk=100):
    for i in range(start, len(prompt), chunk):  # the runtime's batch holds 128 tokens
        part = prompt[i:i + chunk]
        r = step(runs=(Run(seq, i, tuple(part), i + len(part) == len(prompt)),))
    out = [r.sampled[0].token]
    while len(out) < n:
        r = step(runs=(Run(seq, len(prompt) + len(out) - 1, (PLACEHOLDER,), True),))
        out.append(r.sampled[0].token)
    step(closes=(seq,))
    return out


def test_restored_lane_continues_like_a_fresh_one(rt, long_prompt, tmp_path):
    from superfluid.plan import Load, Save, kv_key
    from superfluid.runtime.kvstore import KvStore

    want = greedy(rt, 0, long_prompt, 8, chunk=100)
    rt.kv_store = KvStore(tmp_path, "test", 1 << 30)
    try:
        step = Stepper(rt)
        # lane 1 prefills the prompt; its first 128 tokens (a block boundary) go to disk
        step(opens=(LaneOpen(1, GREEDY),))
        for i in range(0, len(long_prompt), 100):
            step(runs=(Run(1, i, tuple(long_prompt[i:i + 100]), False),))
        head = tuple(long_prompt[:128])
        r = step(saves=(Save(1, kv_key(head), head),), closes=(1,))
        assert r.kvio.saved > 128 * 10_000  # ~23 kB of KV per token for this model
        rt.kv_store.flush()
        # restored at the boundary, then the rest prefilled
        r = step(opens=(LaneOpen(2, GREEDY),), loads=(Load(2, kv_key(head), 128),))
        assert r.failed == () and r.kvio.restored > 0
        # what lane 1 computed, cut at 128 in memory, continued the same way: a row's numbers
        # depend on the run it is computed in (flash attention, matmul paths), so a fresh lane
        # cut elsewhere may part at a near tie (it did on an AMD EPYC)
        step(opens=(LaneOpen(0, GREEDY),))
        for i in range(0, 200, 100):
            step(runs=(Run(0, i, tuple(long_prompt[i:i + 100]), False),))
        step(closes=(0,))
        step(opens=(LaneOpen(0, GREEDY, keep=128),))
        assert continue_greedy(step, 2, long_prompt, 128, 8) == continue_greedy(step, 0, long_prompt, 128, 8)
        # restored mid-block (the entry cut to 100 tokens), then a partial prefill
        step(opens=(LaneOpen(3, GREEDY),), loads=(Load(3, kv_key(head), 100),))
        assert continue_greedy(step, 3, long_prompt, 100, 8) == want
        # a missing entry: that lane is reported and skipped, a lane in the same step is not
        r = step(opens=(LaneOpen(2, GREEDY), LaneOpen(0, GREEDY)), loads=(Load(2, 12345, 100),),
                 runs=(Run(2, 100, tuple(long_prompt[100:200]), True), Run(0, 0, tuple(long_prompt[:20]), True)))
        assert r.failed == (2,) and [s.seq for s in r.sampled] == [0]
        step(closes=(0, 2))
    finally:
        rt.kv_store.close()
        rt.kv_store = None
