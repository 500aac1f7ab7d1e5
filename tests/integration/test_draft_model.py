"""Speculative decoding with a draft model (`--speculative draft --draft-model GGUF`): the
embedded SmolLM2-135M drafted for by its own first 4 layers (tests/integration/draft_gguf.py).
The target verifies the drafts as it verifies n-gram drafts, so the output is token for token
the output without speculation, greedy and sampled; /metrics counts the drafts; a draft model
of another vocabulary is refused when the model loads, with the reason.

Cutting layers makes a poor drafter (about 1 draft in 20 accepted with 4 or even 20 of the 30
layers, measured): the cut exercises rejection and rollback; acceptance is checked with the
model drafting for itself."""

from __future__ import annotations

import time

import httpx
import llama_cpp as ll
import pytest

from superfluid.codec.template import ChatTemplate
from superfluid.errors import ModelLoadError
from superfluid.request import SamplingParams
from superfluid.runtime.draft_model import DraftModel
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.registry import embedded_model

from .conftest import MODEL
from .daemon import Daemon
from .draft_gguf import draft_gguf
from .fleet import Node
from .test_speculative import Lane, _metric, tok  # noqa: F401 -- a fixture

ASK = [{"role": "user", "content": "Name the days of the week, in order."}]  # short: prefills are most of the cost


@pytest.fixture(scope="module")
def prompt(tok):  # noqa: F811
    return tok.encode_prompt(ChatTemplate(tok.chat_template).render(ASK))


@pytest.fixture(scope="module")
def rt():
    r = LlamaCppRuntime(embedded_model().path, lanes=4, n_ctx=1024, threads=1, batch_tokens=512)
    r.attach_draft(draft_gguf())
    yield r
    r.close()


@pytest.fixture(scope="module")
def greedy(rt, prompt):  # noqa: F811
    """20 greedy tokens without speculation."""
    return Lane(rt, 0).generate(prompt, SamplingParams(temperature=0), 0, 20)


def test_drafted_greedy_and_sampled_output_is_the_output_without_speculation(rt, prompt, greedy):  # noqa: F811
    """The 4-layer drafter is a poor guesser: most drafts are rejected and rolled back, and
    the output is still the target's own."""
    spec, _, drafted = Lane(rt, 1).generate(prompt, SamplingParams(temperature=0), 3, 20)
    assert spec == greedy[0] and drafted > 0
    # the draft model's KV for the lane holds exactly what it says, no position past it: the
    # lane's text (rejected drafts rolled back at each next step), then the last step's drafts
    held, n = rt.drafter.held[1], len(prompt) + len(spec) // 2
    assert held[:n] == (list(prompt) + spec)[:n]
    assert ll.llama_memory_seq_pos_max(rt.drafter.mem, 1) + 1 == len(held)
    sp = SamplingParams(temperature=0.9, top_p=0.95, seed=5)
    plain, _, _ = Lane(rt, 2).generate(prompt, sp, 0, 12)
    spec, _, drafted = Lane(rt, 3).generate(prompt, sp, 3, 12)
    assert spec == plain and drafted > 0


def test_accepted_drafts_advance_the_lane_several_tokens_a_step(rt, prompt, greedy):  # noqa: F811
    """The model as its own drafter (the same vocabulary, trivially): greedy drafts are the
    target's greedy tokens, so nearly all are accepted, the lane moves up to 5 tokens a
    step, and the draft model's KV follows the accepted tokens without a re-prefill."""
    cut = rt.drafter
    rt.drafter = DraftModel(embedded_model().path, rt.vocab, lanes=rt.info.n_lanes, n_ctx=rt.info.n_ctx,
                            threads=1, batch_tokens=512)
    try:
        spec, steps, drafted = Lane(rt, 1).generate(prompt, SamplingParams(temperature=0), 4, 20)
        assert spec == greedy[0]
        assert steps <= greedy[1] // 3 and drafted >= 0.9 * 4 * steps
    finally:
        rt.drafter.close()
        rt.drafter = cut


def test_a_draft_model_of_another_vocabulary_is_refused(rt):
    with pytest.raises(ModelLoadError, match="token 11 is '<jupyter_START>' there") as e:
        LlamaCppRuntime.attach_draft(rt, draft_gguf(renamed=True))
    assert "a draft model must share its vocabulary" in e.value.message


def test_the_daemon_drafts_with_the_model_and_answers_as_one_without_it(daemon):
    d = Daemon("--speculative", "draft", "--draft-model", draft_gguf(), "--spec-max-tokens", "6", "--sessions-cache")
    try:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 24, "temperature": 0}
        want = httpx.post(daemon.url + "/v1/chat/completions", json=body, timeout=120).json()
        got = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=120).json()
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
        assert _metric(d, "superfluid_draft_tokens_total") > 0
    finally:
        d.stop()


def test_a_fleet_node_drafts_with_its_own_draft_model_for_a_draft_head(daemon):
    """A head with --speculative draft asks its nodes for drafts; the node proposes them with
    the draft model it was started with: the same text as without speculation, and drafts
    counted in the head's /metrics (it sums its nodes' counters)."""
    node = Node("--speculative", "draft", "--draft-model", draft_gguf())
    head = None
    try:
        head = Daemon("--fleet", f"127.0.0.1:{node.port}", "--speculative", "draft", "--draft-model", draft_gguf(),
                      "--spec-max-tokens", "6")
        body = {"model": MODEL, "messages": ASK, "max_tokens": 24, "temperature": 0}
        want = httpx.post(daemon.url + "/v1/chat/completions", json=body, timeout=120).json()
        got = httpx.post(head.url + "/v1/chat/completions", json=body, timeout=120).json()
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        for _ in range(50):  # the node reports its counters within a status interval
            if _metric(head, "superfluid_draft_tokens_total") > 0:
                break
            time.sleep(0.2)
        assert _metric(head, "superfluid_draft_tokens_total") > 0
    finally:
        if head is not None:
            head.stop()
        node.stop()
