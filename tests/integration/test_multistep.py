"""Multi-step decode (Run.more, sched/multistep.py) on the embedded model: a plan that lets
each lane decode its own samples several times gives token for token what a plan a step
gives, greedy and sampled, two lanes side by side; a lane whose sampler ends (its grammar is
done) stops there while the other goes on; and the daemon runs such plans by default. And
llama.cpp computes on a persistent threadpool."""

from __future__ import annotations

import httpx
import pytest

from superfluid.codec import grammar as gr
from superfluid.codec.template import ChatTemplate
from superfluid.codec.tokenizer import Tokenizer
from superfluid.plan import PLACEHOLDER, LaneOpen, Run
from superfluid.request import SamplingParams
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.registry import embedded_model

from .conftest import MODEL
from .test_llamacpp_runtime import Stepper
from .test_speculative import _metric

QUESTION = [{"role": "user", "content": "Name three rivers of Europe and say one thing about each."}]


@pytest.fixture(scope="module")
def rt():
    r = LlamaCppRuntime(embedded_model().path, lanes=2, n_ctx=512, threads=1, batch_tokens=256)
    yield r
    r.close()


@pytest.fixture(scope="module")
def prompt():
    tok = Tokenizer(embedded_model().path)
    return tok.encode_prompt(ChatTemplate(tok.chat_template).render(QUESTION))


def generate(rt, lanes: dict[int, tuple[tuple[int, ...], SamplingParams]], more: int, total: int):
    """Every lane's tokens, all lanes decoding in each plan as the scheduler plans them, with
    `more` further forwards a plan; and the plans it took."""
    step = Stepper(rt)
    step(opens=tuple(LaneOpen(q, sp) for q, (_, sp) in lanes.items()))
    r = step(runs=tuple(Run(q, 0, p, True) for q, (p, _) in lanes.items()))
    out = {q: [] for q in lanes}
    for s in r.sampled:
        out[s.seq].append(s.token)
    plans = 0
    while live := [q for q in lanes if len(out[q]) < total and not rt._samplers[q].ended(out[q][-1])]:
        r = step(runs=tuple(Run(q, len(lanes[q][0]) + len(out[q]) - 1, (PLACEHOLDER,), True, 0,
                                min(more, total - len(out[q]) - 1)) for q in live))
        assert not r.errors, r.errors
        for s in r.sampled:
            out[s.seq].append(s.token)
        plans += 1
    step(closes=tuple(lanes))
    return out, plans


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0),
                                SamplingParams(temperature=0.9, top_p=0.95, seed=3, repeat_penalty=1.1)],
                         ids=["greedy", "sampled"])
def test_several_forwards_a_plan_give_the_tokens_of_one_a_plan(rt, prompt, sp):
    lanes = {0: (tuple(prompt), sp), 1: (tuple(prompt[:-3]) + tuple(prompt[-2:]), sp)}
    one, one_plans = generate(rt, lanes, 0, 40)
    four, four_plans = generate(rt, lanes, 3, 40)
    assert four == one
    assert all(len(t) == 40 for t in four.values())
    assert four_plans <= one_plans / 3


def test_a_lane_whose_grammar_is_done_stops_while_the_other_goes_on(rt, prompt):
    done = SamplingParams(temperature=0, grammar=gr.json_schema({"type": "boolean"}, "response_format"))
    lanes = {0: (tuple(prompt), done), 1: (tuple(prompt), SamplingParams(temperature=0))}
    alone, _ = generate(rt, {1: lanes[1]}, 0, 24)
    out, _ = generate(rt, lanes, 7, 24)
    assert out[1] == alone[1]
    text = Tokenizer(embedded_model().path).decode([t for t in out[0] if t not in rt.eog])
    assert text.strip() in ("true", "false")
    assert len(out[0]) < 8  # it ended within the first plan of several forwards: nothing after


def test_the_daemon_runs_several_decode_forwards_a_plan(daemon):
    before = _metric(daemon, "superfluid_steps_total")
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 64, "temperature": 0, "ignore_eos": True}
    got = httpx.post(daemon.url + "/v1/chat/completions", json=body, timeout=120).json()
    assert got["usage"]["completion_tokens"] == 64
    plans = _metric(daemon, "superfluid_steps_total") - before
    assert plans < 56, plans  # 65 without them: a plan a token, and the prompt's


def test_a_decode_fed_the_end_token_its_request_ended_at_runs_once(rt, prompt):
    """A decode planned before its lane's end token came back feeds that token (its KV is the
    next turn's prefix) and goes no further; a lane that ignores end tokens goes on."""
    step = Stepper(rt)
    end = int(rt.eog[0])
    lanes = {0: SamplingParams(temperature=0), 1: SamplingParams(temperature=0, ignore_eos=True)}
    step(opens=tuple(LaneOpen(q, sp) for q, sp in lanes.items()))
    step(runs=tuple(Run(q, 0, tuple(prompt), True) for q in lanes))
    r = step(runs=tuple(Run(q, len(prompt), (end,), True, 0, 3) for q in lanes))
    assert [s.seq for s in r.sampled].count(0) == 1
    assert [s.seq for s in r.sampled].count(1) == 4
    assert rt.lane_len(0) == len(prompt) + 1
    step(closes=tuple(lanes))


def test_the_runtime_computes_on_a_persistent_threadpool(rt):
    """Attached as llama-server attaches one (runtime/threadpool.py): a llama.cpp whose
    parameters are laid out otherwise would leave it off with a warning, and this fails."""
    assert rt.pool is not None and rt.pool.pool
