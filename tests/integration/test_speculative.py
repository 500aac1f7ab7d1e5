"""Speculative decoding (n-gram and suffix-tree drafts verified in the step's batch) on the embedded model:
token-for-token the output of decoding without it, greedy, sampled (every seed) and under a
grammar; the first sampled token's distribution is the model's (chi-square over seeds); and
through the daemon, the same text as a daemon without speculation, a cut stream resumed to
the uncut text, and the drafts counted in /metrics."""

from __future__ import annotations

import json
import math
import signal
import time

import httpx
import numpy as np
import pytest

from superfluid.codec import grammar as gr
from superfluid.codec.template import ChatTemplate
from superfluid.codec.tokenizer import Tokenizer
from superfluid.plan import PLACEHOLDER, LaneOpen, Run, StepPlan
from superfluid.request import SamplingParams
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.registry import embedded_model
from superfluid.runtime.suffix import SuffixDrafter

from .conftest import MODEL, need_suffix_tree
from .daemon import Daemon
from .fleet import Node
from .test_typed_resume import _cut_after, _resume

CODE = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(8))
EDIT = [{"role": "user", "content": "Repeat this code exactly, with f3 renamed to g3:\n" + CODE}]


@pytest.fixture(scope="module", params=["ngram", "suffix"])
def rt(request):
    """The runtime with each drafter: prompt lookup, and suffix trees (runtime/suffix.py)."""
    if request.param == "suffix":
        need_suffix_tree()
    r = LlamaCppRuntime(embedded_model().path, lanes=4, n_ctx=1024, threads=1, batch_tokens=512)
    if request.param == "suffix":
        r.drafter = SuffixDrafter()
    yield r
    r.close()


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(embedded_model().path)


@pytest.fixture(scope="module")
def prompt(tok):
    return tok.encode_prompt(ChatTemplate(tok.chat_template).render(EDIT))


class Lane:
    """One lane driven step by step as the scheduler would (decodes carry PLACEHOLDER)."""
    n = 0

    def __init__(self, rt, seq: int):
        self.rt, self.seq = rt, seq

    def step(self, **kw):
        Lane.n += 1
        return self.rt.step(StepPlan(Lane.n, **kw))

    def generate(self, prompt, sp: SamplingParams, draft: int, total: int,
                 more: int = 0) -> tuple[list[int], int, int]:
        """(tokens, steps, drafted); `more`: further forwards a plan (Run.more)"""
        self.step(opens=(LaneOpen(self.seq, sp),))
        r = self.step(runs=(Run(self.seq, 0, tuple(prompt), True),))
        out, steps, drafted = [s.token for s in r.sampled], 0, 0
        while len(out) < total and out[-1] not in self.rt.eog:
            left = total - len(out) - 1  # the scheduler's room: never past the request's end
            r = self.step(runs=(Run(self.seq, len(prompt) + len(out) - 1, (PLACEHOLDER,), True,
                                    min(draft, left), max(0, min(more, left - draft))),))
            assert not r.errors, r.errors
            out += [s.token for s in r.sampled]
            drafted += sum(n for _, n in r.drafted)
            steps += 1
        self.step(closes=(self.seq,))
        return out[:total], steps, drafted


def test_greedy_speculation_gives_the_same_tokens_in_fewer_steps(rt, prompt):
    plain, plain_steps, _ = Lane(rt, 0).generate(prompt, SamplingParams(temperature=0), 0, 64)
    spec, spec_steps, drafted = Lane(rt, 1).generate(prompt, SamplingParams(temperature=0), 8, 64)
    assert spec == plain
    assert drafted > 0 and spec_steps < plain_steps  # the code is repeated: drafts are accepted


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0), SamplingParams(temperature=0.9, seed=5)],
                         ids=["greedy", "sampled"])
def test_a_plan_with_drafts_and_more_forwards_gives_the_same_tokens(rt, prompt, sp):
    """A decode run granted drafts and further forwards (Run.more): drafts where the drafter
    proposes any (one forward), several forwards where it proposes none; the lane's tokens
    are those of no speculation."""
    plain, plain_steps, _ = Lane(rt, 0).generate(prompt, sp, 0, 64)
    spec, spec_steps, drafted = Lane(rt, 1).generate(prompt, sp, 6, 64, more=3)
    assert spec == plain
    assert drafted > 0 and spec_steps < plain_steps / 2


@pytest.mark.parametrize("seed", range(3))
def test_sampled_speculation_gives_the_same_tokens_for_every_seed(rt, prompt, seed):
    sp = SamplingParams(temperature=0.9, top_p=0.95, seed=seed, repeat_penalty=1.1)
    plain, _, _ = Lane(rt, 0).generate(prompt, sp, 0, 60)
    spec, _, _ = Lane(rt, 2).generate(prompt, sp, 6, 60)
    assert spec == plain


def test_a_grammar_lane_speculates_within_its_grammar(rt, tok):
    """A JSON schema whose answer repeats the prompt's text: drafts the grammar rejects are
    never verified, and the output is the unconstrained-by-speculation one, valid JSON."""
    import json
    schema = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 200}}, "required": ["code"],
              "additionalProperties": False}
    msgs = [{"role": "user", "content": 'Answer as JSON {"code": ...} with this code: ' + CODE[:120]}]
    p = tok.encode_prompt(ChatTemplate(tok.chat_template).render(msgs))
    sp = SamplingParams(temperature=0, grammar=gr.json_schema(schema, "response_format"))
    plain, _, _ = Lane(rt, 0).generate(p, sp, 0, 90)
    spec, _, drafted = Lane(rt, 3).generate(p, sp, 8, 90)
    assert spec == plain
    text = tok.decode([t for t in spec if t not in rt.eog])
    if len(spec) < 90:  # it finished inside the budget: the grammar ended it as valid JSON
        assert "code" in json.loads(text)


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value a statistic exceeds with probability ~0.001 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_the_first_sampled_token_follows_the_models_distribution(rt, tok):
    """A context that ends with an n-gram seen before, so every decode verifies drafts: over
    300 seeds the token sampled after it has the model's probabilities (chi-square), not
    the draft's (accepting the draft more often than p(draft) would fail it). The seeds run
    four at a time, one per lane, each lane holding the same context."""
    words = tok.encode(" the river runs to the sea and the sea runs to the sky", parse_special=False)
    ctx = words * 3  # ...runs to the | sea: the drafter proposes what followed last time
    seqs = range(rt.info.n_lanes)
    lane = Lane(rt, 0)
    lane.step(opens=tuple(LaneOpen(s, SamplingParams(temperature=0)) for s in seqs))
    lane.step(runs=tuple(Run(s, 0, tuple(ctx[:-1]), False) for s in seqs))
    # the model's distribution after the whole context (one plain forward, then dropped)
    logits = rt.forward((Run(0, len(ctx) - 1, (ctx[-1],), True),))[0].astype(np.float64)
    rt.drop_tail(0, len(ctx) - 1)
    rt.lanes.keep(0, len(ctx) - 1)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    counts: dict[int, int] = {}
    n = 300
    drafted = 0
    for first in range(0, n, len(seqs)):
        batch = list(zip(seqs, range(first, min(n, first + len(seqs))), strict=False))
        rt.step(StepPlan(10_000 + first, opens=tuple(
            LaneOpen(s, SamplingParams(temperature=1.0, seed=seed), keep=len(ctx) - 1) for s, seed in batch)))
        # one draft a lane: the first token is what the test counts
        r = rt.step(StepPlan(20_000 + first, runs=tuple(Run(s, len(ctx) - 1, (ctx[-1],), True, 1) for s, _ in batch)))
        assert not r.errors, r.errors
        assert sorted(s for s, k in r.drafted if k > 0) == [s for s, _ in batch]  # every decode verified drafts
        drafted += sum(k for _, k in r.drafted)
        firsts: dict[int, int] = {}
        for sm in r.sampled:  # a lane's first Sampled is its token after the context
            firsts.setdefault(sm.seq, sm.token)
        assert sorted(firsts) == [s for s, _ in batch]
        for t in firsts.values():
            counts[t] = counts.get(t, 0) + 1
    assert drafted >= n and sum(counts.values()) == n
    big = [t for t in np.argsort(-p) if p[t] * n >= 5]
    observed = [counts.get(int(t), 0) for t in big] + [n - sum(counts.get(int(t), 0) for t in big)]
    expected = [p[t] * n for t in big] + [n * (1 - sum(p[t] for t in big))]
    pairs = [(o, e) for o, e in zip(observed, expected, strict=True) if e > 0]
    chi2 = sum((o - e) ** 2 / e for o, e in pairs)
    assert len(pairs) >= 3
    assert chi2 < _chi2_critical(len(pairs) - 1), (chi2, observed, [round(e, 1) for e in expected])
    lane.step(closes=tuple(seqs))


# -- through the daemon ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def spec_daemon():
    d = Daemon("--speculative", "ngram", "--spec-max-tokens", "6", "--resume-grace", "0")
    yield d
    d.stop()


def _metric(d: Daemon, name: str) -> float:
    for line in httpx.get(d.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_daemon_speculates_and_answers_as_one_without_it(spec_daemon, daemon):
    body = {"model": MODEL, "messages": EDIT, "max_tokens": 80, "temperature": 0}
    want = httpx.post(daemon.url + "/v1/chat/completions", json=body, timeout=120).json()
    got = httpx.post(spec_daemon.url + "/v1/chat/completions", json=body, timeout=120).json()
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    for k in ("prompt_tokens", "completion_tokens"):  # cached_tokens: the shared daemon may hold the prefix
        assert got["usage"][k] == want["usage"][k]
    assert _metric(spec_daemon, "superfluid_draft_tokens_total") > 0
    assert _metric(spec_daemon, "superfluid_draft_accepted_tokens_total") > 0
    assert 0 < _metric(spec_daemon, "superfluid_draft_acceptance_rate") <= 1


@pytest.fixture(scope="module")
def suffix_daemon():
    need_suffix_tree()
    d = Daemon("--speculative", "suffix", "--spec-max-tokens", "8", "--resume-grace", "0")
    yield d
    d.stop()


@pytest.mark.parametrize("which", ["spec_daemon", "suffix_daemon"], ids=["ngram", "suffix"])
def test_a_cut_sampled_stream_resumes_to_the_uncut_text_with_speculation(request, which):
    spec_daemon = request.getfixturevalue(which)  # (before the suffix daemon is killed below)
    body = {"model": MODEL, "messages": EDIT, "max_tokens": 60, "temperature": 0.8, "seed": 11}
    whole = httpx.post(spec_daemon.url + "/v1/chat/completions", json=body, timeout=120).json()

    def content(d):
        return isinstance(d, dict) and d["choices"] and d["choices"][0]["delta"].get("content")
    sid, seen, cursor = _cut_after(spec_daemon.url + "/v1/chat/completions", {**body, "stream": True}, content)
    for _ in range(300):  # the daemon notices the hang-up and cuts the generation
        if not httpx.get(f"{spec_daemon.url}/v1/sessions/{sid}", timeout=10).json()["busy"]:
            break
    rest = _resume(spec_daemon.url, sid, cursor)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in seen + rest
                   if isinstance(e, dict) and e.get("choices"))
    assert text == whole["choices"][0]["message"]["content"]


def test_suffix_drafts_answer_as_one_without_them_and_an_answer_given_before_is_drafted(suffix_daemon, daemon):
    """The edit through the daemon with suffix drafts: the same text, drafts accepted. Then a
    question whose answer repeats nothing of its prompt, asked twice: the first answer drafts
    little (nothing to match), the second is drafted from the first (the global tree), and so
    is a third after the daemon was killed and started again on its home."""
    body = {"model": MODEL, "messages": EDIT, "max_tokens": 64, "temperature": 0}
    want = httpx.post(daemon.url + "/v1/chat/completions", json=body, timeout=120).json()
    got = httpx.post(suffix_daemon.url + "/v1/chat/completions", json=body, timeout=120).json()
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert _metric(suffix_daemon, "superfluid_draft_accepted_tokens_total") > 0
    free = {"model": MODEL, "messages": [{"role": "user", "content": "Describe a walk through a forest in autumn."}],
            "max_tokens": 64, "temperature": 0}
    accepted = []
    texts = []
    for _ in range(2):
        before = _metric(suffix_daemon, "superfluid_draft_accepted_tokens_total")
        r = httpx.post(suffix_daemon.url + "/v1/chat/completions", json=free, timeout=120).json()
        texts.append(r["choices"][0]["message"]["content"])
        accepted.append(_metric(suffix_daemon, "superfluid_draft_accepted_tokens_total") - before)
    assert texts[0] == texts[1]
    assert accepted[1] >= 32 and accepted[1] > 2 * accepted[0], accepted
    # the outputs outlive the daemon (killed) in its home: drafted again after the restart
    suffix_daemon.stop(signal.SIGKILL)
    again = Daemon("--speculative", "suffix", "--spec-max-tokens", "8", home=suffix_daemon.home)
    try:
        httpx.post(again.url + "/v1/chat/completions", json=free, timeout=120).raise_for_status()
        after = _metric(again, "superfluid_draft_accepted_tokens_total")
        assert after >= 32 and after > 2 * accepted[0], (after, accepted)
    finally:
        again.stop()


def test_suffix_drafts_never_carry_one_keys_answer_into_anothers(tmp_path):
    """Issue 54: a lane open crossed Link W without its cache namespace, so every key shared
    one suffix tree: key B's answer, repeating key A's, had nearly every draft accepted. Now
    B (and A under a cache_salt) drafts as little as a first answer does; A's own repeat is
    drafted from its first answer. /metrics counts the accepted drafts."""
    need_suffix_tree()
    p = tmp_path / "keys.json"
    p.write_text(json.dumps({"keys": [{"name": "a", "key": "sk-key-a-0000"}, {"name": "b", "key": "sk-key-b-0000"}]}))
    admin = {"authorization": "Bearer sk-admin-0000"}
    d = Daemon("--api-key", "sk-admin-0000", "--key-policy", str(p), "--speculative", "suffix",
               "--spec-max-tokens", "8")

    def accepted_drafts() -> float:
        for line in httpx.get(d.url + "/metrics", headers=admin, timeout=10).text.splitlines():
            if line.startswith("superfluid_draft_accepted_tokens_total"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def ask(key: str, **extra) -> tuple[str, float]:
        before = accepted_drafts()
        r = httpx.post(d.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=120,
                       json={"model": MODEL, "max_tokens": 64, "temperature": 0, **extra, "messages": [
                           {"role": "user", "content": "Describe a walk through a forest in autumn."}]})
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"], accepted_drafts() - before
    try:
        a_text, a_first = ask("sk-key-a-0000")
        b_text, b = ask("sk-key-b-0000")
        _, a_salted = ask("sk-key-a-0000", cache_salt="team-x")
        _, a_again = ask("sk-key-a-0000")
    finally:
        d.stop()
    assert a_text == b_text  # the same answer: before the fix B's was drafted from A's
    assert a_again >= 32 and a_again > 2 * a_first, (a_first, a_again)
    assert b < 32 and a_again > 2 * b, (b, a_again)
    assert a_salted < 32 and a_again > 2 * a_salted, (a_salted, a_again)


@pytest.mark.parametrize("node_args", [(), ("--speculative", "suffix")], ids=["default", "suffix"])
def test_a_fleet_node_speculates_as_its_head_says(daemon, node_args):
    """The node runs with speculation off (its default); the head's --speculative travels
    with each generation, and the node verifies drafts for it: the same text, drafts counted
    in the head's /metrics (it sums its nodes' counters). A node started with `--speculative
    suffix` drafts from its suffix trees when its head asks for drafts."""
    if node_args:
        need_suffix_tree()
    node = Node(*node_args)
    head = None
    try:
        head = Daemon("--fleet", f"127.0.0.1:{node.port}", "--speculative", "ngram", "--spec-max-tokens", "6")
        body = {"model": MODEL, "messages": EDIT, "max_tokens": 80, "temperature": 0}
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
