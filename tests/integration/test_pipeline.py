"""Pipelines of 2 and 3 stage nodes (`node serve --stage`) on loopback behind a head
(`serve --pipeline`), driven with the openai client: greedy output equals plain
`model.generate` on one machine; each stage holds only its layers; a decoded token is fed
once per stage whatever the context; a stage killed mid-stream is a typed error and the
daemon serves again once the stage is back; with a spare stage, a stream whose stage dies
goes on (re-prefilled on the spare) and gives the uninterrupted tokens."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import signal
import time

import anthropic
import httpx
import ollama
import openai
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from superfluid.net.transport import Link  # noqa: E402
from superfluid.link import messages as m  # noqa: E402

from . import hf  # noqa: E402
from .conftest import need_suffix_tree  # noqa: E402
from .daemon import Daemon  # noqa: E402
from .fleet import Node, together  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
N = 16


@pytest.fixture(scope="module")
def stages():
    hf.folder()  # converted once, into the home the stages share
    nodes = together(*[lambda: Node("--stage", home=str(hf.HOME))] * 3)
    yield nodes
    for n in nodes:
        n.stop()


def head(nodes, *args: str) -> Daemon:
    return Daemon("--pipeline", ",".join(f"127.0.0.1:{n.port}" for n in nodes), "--sessions-cache", *args,
                  max_context=1024, max_batch=4)


@pytest.fixture(scope="module")
def two(stages):
    """One head on the first two stages, shared by the tests that need one (each head that
    connects has its stages load their layers); the stage-kill test is the last to use it."""
    d = head(stages[:2])
    yield d
    d.stop()


def oc(d: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=120)


def expected(question: str, n: int = N) -> str:
    toks = hf.generate(hf.chat_prompt(question), n)  # memoized: the tests ask for the same answers again
    return hf.tokenizer().decode([t for t in toks if t not in hf.EOG])


def ask(d: Daemon, question: str, **kw):
    return oc(d).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                         temperature=0, max_tokens=N, **kw)


def stage_status(node: Node) -> dict:
    async def hello() -> dict:
        link = await Link.dial("127.0.0.1", node.port, m.LINK_F, None)
        ack = await link.greet(m.Hello((m.VERSION,), "test"))
        link.close()
        return ack.status.report()
    return asyncio.run(hello())


def test_bad_stage_requests_are_answered_with_errors_and_the_stage_keeps_serving(stages):
    async def talk() -> list[dict]:
        link = await Link.dial("127.0.0.1", stages[0].port, m.LINK_F, None)
        link.send_raw(m.HELLO, {"versions": [m.VERSION], "head": "fuzz"})
        assert (await link.recv())[0] == m.HELLO_ACK

        async def ask(kind, body, want):
            link.send_raw(kind, body)
            while True:
                k, b = await asyncio.wait_for(link.recv(), 120)
                if k == want:
                    return b
        import numpy as np
        answers = [
            await ask(m.STAGE_FORWARD_REQ, {"id": 1, "items": [["s", 0, [1, 2], None, True]]}, m.STAGE_FORWARD_RESP),
            await ask(m.STAGE_LOAD, {"first": 5, "last": 2}, m.STAGE_READY),
            await ask(m.STAGE_LOAD, {"first": "x"}, m.STAGE_READY),
            await ask(m.STAGE_LOAD, {"first": 0, "last": 15}, m.STAGE_READY),
            await ask(m.STAGE_FORWARD_REQ, {"id": 2, "items": [["s", 0, [10 ** 6], None, True]]}, m.STAGE_FORWARD_RESP),
            await ask(m.STAGE_FORWARD_REQ, {"id": 3, "items": [["s", 5, [1], None, True]]}, m.STAGE_FORWARD_RESP),
            await ask(m.STAGE_FORWARD_REQ, {"id": 4, "items": "junk"}, m.STAGE_FORWARD_RESP),
        ]
        link.send_raw(m.STAGE_COPY, {"src": "s", "dst": "t", "n": -1})  # no answer; must not break the session
        answers.append(await ask(m.STAGE_FORWARD_REQ, {"id": 5, "items": [["s", 0, [1, 2, 3], None, True]]},
                                 m.STAGE_FORWARD_RESP))
        link.close()
        return answers, np
    answers, np = asyncio.run(talk())
    assert all(a.get("error") for a in answers[:3]) and not answers[3].get("error")
    assert answers[3]["first"] == 0 and answers[3]["last"] == 15
    assert all(a.get("error") for a in answers[4:7]), answers[4:7]
    (out,) = answers[7]["outs"]
    assert m.unpack_array(out).shape == (3, 576)  # activations for the next stage
    assert stages[0].proc.poll() is None


@pytest.mark.parametrize("k", [2, 3])
def test_a_pipeline_gives_the_tokens_of_one_model(stages, request, k):
    """With 3 stages the head speculates (suffix trees; the path is the same for every
    drafter, which drafts in the head's worker): the last stage returns logits for each
    drafted row, and the tokens are still those of one model."""
    if k == 3:
        need_suffix_tree()
    d = request.getfixturevalue("two") if k == 2 else head(stages[:k], "--speculative", "suffix")
    try:
        qs = ["What is the capital of France?", "Name a color.", "Say hello in French."]
        if k == 3:
            qs.append("Repeat exactly: the cat sat on the mat, the cat sat on the mat.")
        with concurrent.futures.ThreadPoolExecutor(len(qs)) as pool:  # decode steps batched across sessions
            got = list(pool.map(lambda q: ask(d, q).choices[0].message.content, qs))
        assert got == [expected(q) for q in qs]
        stream = ask(d, "Write one sentence about the sea.", stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
            expected("Write one sentence about the sea.")
        desc = next(iter(d.health()["models"].values()))
        assert desc["ready"]
        drafted = httpx.get(d.url + "/metrics").text.split("superfluid_draft_tokens_total{")[1].split()[1]
        assert (float(drafted) > 0) == (k == 3), drafted
        if k == 2:  # every API runs on the pipeline as on one machine
            q = "Name a color."
            am = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0).messages.create(
                model=MODEL, max_tokens=N, extra_body={"temperature": 0}, messages=[{"role": "user", "content": q}])
            assert am.content[0].text == expected(q)
            om = ollama.Client(host=d.url).chat(model=MODEL, messages=[{"role": "user", "content": q}],
                                                 options={"temperature": 0, "num_predict": N})
            assert om.message.content == expected(q)
    finally:
        if k != 2:
            d.stop()
    # each stage held only its layers: contiguous ranges over all 30; the middle ones carry no
    # embedding or head (the first holds the embedding, the last the tied output head: one extra copy)
    ref = hf._reference()
    full = sum(p.numel() for p in ref.parameters())
    embed = ref.get_input_embeddings().weight.numel()
    held = []
    for n in stages[:k]:
        last = re.findall(r"holding layers \[(\d+), (\d+)\) of 30: (\d+) parameters", n.log())[-1]
        held.append(tuple(int(x) for x in last))
    assert [h[:2] for h in held] == [(i * 30 // k, (i + 1) * 30 // k) for i in range(k)]
    assert sum(h[2] for h in held) == full + embed
    assert all(h[2] < full for h in held)
    if k == 3:
        per_layer = (full - embed - ref.model.norm.weight.numel()) // 30
        assert held[1][2] == 10 * per_layer


def test_a_decoded_token_costs_one_pass_per_stage_whatever_the_context(stages, two):
    before = [stage_status(n)["tokens_fed"] for n in stages[:2]]
    long_q = "Summarize: " + "the keeper trimmed the lamp at dusk and watched the sea. " * 40
    r = ask(two, long_q)
    after = [stage_status(n)["tokens_fed"] for n in stages[:2]]
    u = r.usage
    fed = u.prompt_tokens - u.prompt_tokens_details.cached_tokens + u.completion_tokens - 1
    assert u.prompt_tokens > 400 and u.completion_tokens == N
    for b, a in zip(before, after, strict=True):
        # every prompt token once, then one token per decode step (two plans may be in flight at the end);
        # re-running the context per token would be ~N x 400 more
        assert fed <= a - b <= fed + 2


def test_a_stage_killed_mid_stream_is_a_typed_error_and_the_daemon_serves_again(stages, two):
    d = two
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        got = 0
        while got < 3:
            got += next(lines).startswith("data: ")
        stages[1].proc.send_signal(signal.SIGKILL)
        rest = [ln for ln in lines if ln.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    errors = [json.loads(ln[6:]) for ln in rest[:-1] if '"error"' in ln]
    assert errors and errors[0]["error"]["code"] == "stage_unavailable", errors
    assert d.health() is not None  # the daemon answers
    with pytest.raises(openai.APIStatusError):
        ask(d, "Name a color.")  # the stage is still down
    stages[1].proc.wait(10)
    stages[1] = Node("--stage", home=str(hf.HOME), port=stages[1].port)  # back on its port
    assert ask(d, "Name a color.").choices[0].message.content == expected("Name a color.")


def test_a_spare_takes_the_place_of_a_lost_stage_and_the_stream_goes_on(stages):
    spare = Node("--stage", home=str(hf.HOME))
    d = Daemon("--pipeline", f"127.0.0.1:{stages[0].port},127.0.0.1:{stages[2].port}",
               "--pipeline-spares", f"127.0.0.1:{spare.port}", "--sessions-cache", max_context=1024, max_batch=4)
    q = "Write one sentence about the sea."
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 40, "temperature": 0,
                "stream": True}
        text, errors = "", []
        with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=120) as r:
            for ln in r.iter_lines():
                if not ln.startswith("data: {"):
                    continue
                ev = json.loads(ln[6:])
                if "error" in ev:
                    errors.append(ev)
                    continue
                text += ev["choices"][0]["delta"].get("content") or "" if ev["choices"] else ""
                if len(text) > 10 and stages[2].proc.poll() is None:
                    stages[2].proc.send_signal(signal.SIGKILL)  # the last stage dies mid-stream
        assert errors == []
        assert text == expected(q, 40)  # re-prefilled on the spare: the uninterrupted greedy text
        deadline = time.monotonic() + 10  # log lines are written by a thread: wait for it
        while "holding layers [15, 30)" not in spare.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "holding layers [15, 30)" in spare.log()
    finally:
        d.stop()
        spare.stop()
