"""StepPlan / StepResult wire forms."""

import msgpack

from superfluid.plan import LaneOpen, Run, Sampled, StepPlan, StepResult
from superfluid.request import SamplingParams

SP = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=2**40 + 3,
                    presence_penalty=0.5, frequency_penalty=-0.25, repeat_penalty=1.1,
                    top_logprobs=5, ignore_eos=True)
PLAN = StepPlan(
    step=17,
    # a namespace and a store:false open: the wire must carry both (an empty ns hid their loss)
    opens=(LaneOpen(0, SP, (5, 6, 5), ns="key-a\x00salt-\u00e9"), LaneOpen(3, SamplingParams(), persist=False)),
    runs=(Run(0, 0, (1, 2, 3, 4), False), Run(3, 12, (9,), True)),
    closes=(1, 2),
)
RESULT = StepResult(17, (Sampled(3, 44, -0.5, ((44, -0.5), (12, -1.75))), Sampled(1, 2)), 0.0125)


def through_msgpack(w):
    return msgpack.unpackb(msgpack.packb(w, use_bin_type=True), raw=False)


def test_sampling_params_roundtrip():
    assert SamplingParams.from_wire(SP.to_wire()) == SP
    assert SamplingParams.from_wire(through_msgpack(SP.to_wire())) == SP


def test_step_plan_roundtrip():
    assert StepPlan.from_wire(PLAN.to_wire()) == PLAN


def test_step_plan_roundtrip_through_msgpack():
    back = StepPlan.from_wire(through_msgpack(PLAN.to_wire()))
    assert back == PLAN
    assert isinstance(back.runs[0].tokens, tuple) and isinstance(back.opens[0].history, tuple)


def test_empty_step_plan_roundtrip_through_msgpack():
    p = StepPlan(1)
    assert StepPlan.from_wire(through_msgpack(p.to_wire())) == p


def test_step_result_roundtrip():
    assert StepResult.from_wire(RESULT.to_wire()) == RESULT


def test_step_result_roundtrip_through_msgpack():
    back = StepResult.from_wire(through_msgpack(RESULT.to_wire()))
    assert back == RESULT
    assert back.sampled[1].logprob is None
    assert back.sampled[0].top == ((44, -0.5), (12, -1.75))


def test_n_tokens_counts_every_run():
    assert PLAN.n_tokens == 5
    assert StepPlan(1).n_tokens == 0


def test_lane_open_context_roundtrip_and_an_older_four_field_open():
    p = StepPlan(3, opens=(LaneOpen(0, SP, (5,), 2, (7, 8, 9), "ns"),))
    assert StepPlan.from_wire(through_msgpack(p.to_wire())) == p
    w = p.to_wire()
    w[1][0] = w[1][0][:4]
    assert StepPlan.from_wire(w).opens[0].context == ()


def test_a_lane_opens_namespace_and_persist_cross_the_wire():
    """The suffix drafter files a lane's output under LaneOpen.ns and keeps it on disk only
    when persist: a plan that dropped them put every key's text in one shared tree and file."""
    opens = (LaneOpen(0, SP, ns="key-a"), LaneOpen(1, SP, ns="key-b", persist=False), LaneOpen(2, SP))
    back = StepPlan.from_wire(through_msgpack(StepPlan(1, opens=opens).to_wire())).opens
    assert [(o.ns, o.persist) for o in back] == [("key-a", True), ("key-b", False), ("", True)]
