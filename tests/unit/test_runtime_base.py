"""Runtime.step, shared by every runtime: lanes, placeholder resolution, sampling."""

import numpy as np
import pytest

from superfluid.link.conn import Connection
from superfluid.plan import PLACEHOLDER, LaneOpen, Run, StepPlan
from superfluid.request import SamplingParams
from superfluid.runtime.base import ModelInfo, Runtime
from superfluid.runtime.speculate import Drafter
from superfluid.worker.protocol import LINK_W

V = 8


class EchoRuntime(Runtime):
    """Logits that make greedy pick (last input token + 1) % V; records what it was fed."""

    def __init__(self):
        super().__init__()
        self.info = ModelInfo(V, 64, 2, 64, "echo")
        self.eog = np.array([], dtype=np.int64)
        self.fed: list[tuple[int, int, tuple[int, ...]]] = []
        self.open: set[int] = set()

    def open_lane(self, seq, keep):
        self.open.add(seq)

    def close_lane(self, seq):
        self.open.discard(seq)

    def copy_lane(self, src, dst, n):
        self.fed.append((dst, -1, (src, n)))

    def forward(self, runs):
        out = {}
        for r in runs:
            self.fed.append((r.seq, r.pos, r.tokens))
            if r.sample:
                x = np.zeros(V, dtype=np.float32)
                x[(r.tokens[-1] + 1) % V] = 5.0
                out[r.seq] = x
        return out


GREEDY = SamplingParams(temperature=0)


def test_placeholder_is_the_lanes_last_sample():
    rt = EchoRuntime()
    r1 = rt.step(StepPlan(1, (LaneOpen(0, GREEDY),), (Run(0, 0, (1, 2), True),)))
    assert r1.sampled[0].token == 3
    r2 = rt.step(StepPlan(2, (), (Run(0, 2, (PLACEHOLDER,), True),)))
    assert rt.fed[-1] == (0, 2, (3,))
    assert r2.sampled[0].token == 4


def test_placeholder_without_a_sample_is_refused():
    rt = EchoRuntime()
    with pytest.raises(ValueError):
        rt.step(StepPlan(1, (LaneOpen(0, GREEDY),), (Run(0, 0, (PLACEHOLDER,), True),)))


def test_close_forgets_the_lane():
    rt = EchoRuntime()
    rt.step(StepPlan(1, (LaneOpen(1, GREEDY),), (Run(1, 0, (5,), True),)))
    rt.step(StepPlan(2, closes=(1,)))
    assert 1 not in rt.open
    rt.step(StepPlan(3, (LaneOpen(1, GREEDY),), ()))
    with pytest.raises(ValueError):
        rt.step(StepPlan(4, (), (Run(1, 0, (PLACEHOLDER,), True),)))


def test_runs_without_sample_return_nothing():
    rt = EchoRuntime()
    r = rt.step(StepPlan(1, (LaneOpen(0, GREEDY),), (Run(0, 0, (1, 2, 3), False),)))
    assert r.sampled == () and r.step == 1


def test_copies_apply_after_opens_and_before_runs():
    from superfluid.plan import Copy
    rt = EchoRuntime()
    rt.step(StepPlan(1, (LaneOpen(0, GREEDY),), (Run(0, 0, (1, 2, 3), True),)))
    rt.step(StepPlan(2, (LaneOpen(1, GREEDY),), (Run(1, 2, (3,), True),), copies=(Copy(0, 1, 2),)))
    assert rt.fed[-2:] == [(1, -1, (0, 2)), (1, 2, (3,))]


class SumRuntime(EchoRuntime):
    """Embeds an input as [sum of its tokens]; an input holding token 13 breaks the batch."""

    def embed(self, items):
        if any(13 in it.tokens for it in items):
            raise ValueError("token 13 is cursed")
        return [np.array([sum(it.tokens)], dtype=np.float32) for it in items]


def test_a_failing_embed_input_fails_alone_and_the_step_s_generations_go_on():
    from superfluid.plan import EmbedItem

    rt = SumRuntime()
    plan = StepPlan(1, (LaneOpen(0, GREEDY),), (Run(0, 0, (1, 2), True),),
                    embeds=(EmbedItem(5, (1, 2)), EmbedItem(6, (13,)), EmbedItem(7, (4,))))
    r = rt.step(plan)
    assert [(s.seq, s.token) for s in r.sampled] == [(0, 3)]
    by_key = {v.key: v for v in r.vectors}
    assert sorted(by_key) == [5, 6, 7]
    assert np.frombuffer(by_key[5].data, dtype="<f4").tolist() == [3.0] and by_key[5].error == ""
    assert "cursed" in by_key[6].error and by_key[6].data == b""
    assert np.frombuffer(by_key[7].data, dtype="<f4").tolist() == [4.0]


def test_a_runtime_without_embeddings_answers_each_item_with_a_typed_error():
    from superfluid.plan import EmbedItem

    r = EchoRuntime().step(StepPlan(1, embeds=(EmbedItem(1, (1,)), EmbedItem(2, (2,)))))
    assert [(v.key, v.code) for v in r.vectors] == [(1, "model_not_supported"), (2, "model_not_supported")]


class RecordingDrafter(Drafter):
    """Drafts nothing; records what each lane was opened with."""

    def __init__(self):
        self.begun: list[tuple[int, str, bool]] = []

    def propose(self, wants):
        return {}

    def begin(self, seq, ns, persist=True):
        self.begun.append((seq, ns, persist))


def across_link_w(plan: StepPlan) -> StepPlan:
    a, b = Connection(LINK_W), Connection(LINK_W)
    b.receive_data(a.send(plan))
    return b.next_event()[1]


def test_a_lane_open_that_crossed_link_w_tells_the_drafter_its_namespace():
    """Suffix drafts come only from outputs of the lane's namespace (runtime/suffix.py): a
    namespace lost on the way to the worker put every key's text in one shared tree."""
    rt = EchoRuntime()
    rt.drafter = RecordingDrafter()
    rt.step(across_link_w(StepPlan(1, (LaneOpen(0, GREEDY, ns="key-a"), LaneOpen(1, GREEDY, ns="key-b"),
                                       LaneOpen(2, GREEDY)))))
    assert [(q, ns) for q, ns, _ in rt.drafter.begun] == [(0, "key-a"), (1, "key-b"), (2, "")]


def test_a_store_false_lane_open_tells_the_drafter_to_keep_its_output_off_disk():
    rt = EchoRuntime()
    rt.drafter = RecordingDrafter()
    rt.step(across_link_w(StepPlan(1, (LaneOpen(0, GREEDY, ns="k", persist=False), LaneOpen(1, GREEDY)))))
    assert rt.drafter.begun == [(0, "k", False), (1, "", True)]
