"""Code completion for editors on a real daemon: llama-server's POST /infill, `suffix` on
/v1/completions (openai client) and on Ollama's /api/generate (ollama client), all building
llama.cpp's fill-in-the-middle prompt from the model's FIM tokens, in the completion class,
and freeing their lane when the editor drops the request."""

from __future__ import annotations

import json
import re
import time

import httpx
import ollama
import openai
import pytest

from superfluid.codec.tokenizer import Tokenizer
from superfluid.runtime.registry import embedded_model

from .conftest import MODEL
from .daemon import Daemon
from .fim_model import FIM_MID, FIM_PRE, FIM_SUF, fim_gguf

FIM = "SmolLM2-135M-FIM"
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
CTX = 1024


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(fim_gguf(), "--model", embedded_model().path, max_context=CTX, max_batch=2)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(fim_gguf())


def infill(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/infill", json=body, timeout=300)


def psm(tok, prefix: str, suffix: str) -> list[int]:
    return [FIM_PRE, *tok.encode(prefix), FIM_SUF, *tok.encode(suffix), FIM_MID]


def test_infill_fills_the_middle_of_exactly_the_psm_prompt(daemon, tok):
    r = infill(daemon.url, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=16, temperature=0)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["content"] and out["stop"] is True and out["model"] == FIM
    assert out["prompt"] == "<fim_prefix>" + PREFIX + "<fim_suffix>" + SUFFIX + "<fim_middle>"
    assert out["tokens_evaluated"] == len(psm(tok, PREFIX, SUFFIX))
    assert 1 <= out["tokens_predicted"] <= 16
    assert out["stop_type"] == ("limit" if out["tokens_predicted"] == 16 else "eos")
    t = out["timings"]
    assert t["predicted_n"] == out["tokens_predicted"] and t["prompt_ms"] > 0
    # a marker the user typed is text: tokenized without special tokens, so more than one token
    typed = "x = '<fim_middle>'\n"
    r = infill(daemon.url, input_prefix=typed, input_suffix="", n_predict=1, temperature=0)
    assert r.json()["tokens_evaluated"] == len(psm(tok, typed, "")) > 4


def test_stop_strings_and_end_of_generation(daemon):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0, "n_predict": 12, "ignore_eos": True}
    full = infill(daemon.url, **body).json()
    assert full["stop_type"] == "limit" and full["tokens_predicted"] == 12
    text = full["content"]
    word = text[len(text) // 2:len(text) // 2 + 2]
    assert word
    cut = infill(daemon.url, **body, stop=[word]).json()
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word
    assert cut["content"] == text[:text.index(word)]
    # without ignore_eos the middle ends at an end-of-generation token or at the limit, never past it
    free = infill(daemon.url, input_prefix=PREFIX, input_suffix=SUFFIX, temperature=0, n_predict=64).json()
    assert free["stop_type"] in ("eos", "limit") and free["tokens_predicted"] <= 64


def test_input_extra_goes_before_the_prefix(daemon, tok):
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]
    out = infill(daemon.url, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=extra, prompt="return",
                 n_predict=4, temperature=0).json()
    # SmolLM2 has a repo token (<reponame>) but no file separator: llama.cpp's plain snippets
    assert out["prompt"] == ("<reponame>myproject\n\n\n--- snippet ---\n\n" + extra[0]["text"] +
                             "<fim_prefix>" + PREFIX + "return<fim_suffix>" + SUFFIX + "<fim_middle>")
    # far more extra text than the window: the last of it is kept, to leave n_predict tokens free
    big = [{"filename": f"f{i}.py", "text": f"# file {i}\n" + "x = 1\n" * 3000} for i in range(64)]
    n = CTX - 256
    out = infill(daemon.url, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=big, n_predict=n,
                 temperature=0).json()
    assert out["tokens_evaluated"] == CTX - n
    assert out["prompt"].endswith("x = 1\n" * 40 + "<fim_prefix>" + PREFIX + "<fim_suffix>" + SUFFIX + "<fim_middle>")
    assert "# file 62" not in out["prompt"] and "snippet" not in out["prompt"]


def test_streamed_infill_equals_the_whole_answer(daemon):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0, "n_predict": 10}
    whole = infill(daemon.url, **body).json()
    events = []
    with httpx.stream("POST", daemon.url + "/infill", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            assert line != "data: [DONE]"
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["stop"] is True and not any(e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"]
    assert events[-1]["stop_type"] == whole["stop_type"] and "timings" in events[-1]


def test_suffix_on_openai_completions_is_the_same_fim_prompt(daemon, tok):
    oc = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = oc.completions.create(model=FIM, prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens == len(psm(tok, PREFIX, SUFFIX))
    same = infill(daemon.url, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=8, temperature=0).json()
    assert r.choices[0].text == same["content"]
    plain = oc.completions.create(model=FIM, prompt=PREFIX, max_tokens=1, temperature=0)
    assert plain.usage.prompt_tokens == len(tok.encode(PREFIX))  # no suffix: a plain completion
    with pytest.raises(openai.BadRequestError) as e:
        oc.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=4)
    assert e.value.body["param"] == "suffix" and "fill-in-the-middle" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oc.completions.create(model=FIM, prompt=PREFIX, max_tokens=4, extra_body={"suffix": 3})
    assert e.value.body["param"] == "suffix"


def test_suffix_on_ollama_generate(daemon, tok):
    oc = ollama.Client(host=daemon.url)
    r = oc.generate(model=FIM, prompt=PREFIX, suffix=SUFFIX, options={"temperature": 0, "num_predict": 8})
    assert r.prompt_eval_count == len(psm(tok, PREFIX, SUFFIX))
    same = infill(daemon.url, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=8, temperature=0).json()
    assert r.response == same["content"]
    parts = list(oc.generate(model=FIM, prompt=PREFIX, suffix=SUFFIX, stream=True,
                             options={"temperature": 0, "num_predict": 8}))
    assert "".join(p.response for p in parts) == r.response and parts[-1].done
    with pytest.raises(ollama.ResponseError) as e:
        oc.generate(model=MODEL, prompt=PREFIX, suffix=SUFFIX, options={"num_predict": 4})
    assert e.value.status_code == 400 and "fill-in-the-middle" in e.value.error
    for bad in ({"suffix": ["x"]}, {"suffix": "x", "raw": True}):
        r2 = httpx.post(daemon.url + "/api/generate", json={"model": FIM, "prompt": PREFIX, "stream": False, **bad})
        assert r2.status_code == 400, r2.text


@pytest.mark.parametrize("body,param", [
    ({"input_prefix": 3}, "input_prefix"),
    ({"input_suffix": ["x"]}, "input_suffix"),
    ({"input_extra": "a.py"}, "input_extra"),
    ({"input_extra": [{"filename": "a.py"}]}, "input_extra.0.text"),
    ({"input_extra": [{"text": "x", "filename": 7}]}, "input_extra.0.filename"),
    ({"input_extra": [{"text": "x"}] * 65}, "input_extra"),
    ({"n_predict": 0}, "n_predict"),
    ({"n_predict": -2}, "n_predict"),
    ({"temperature": "hot"}, "temperature"),
    ({"stop": [1]}, "stop"),
    ({"stop": ["x"] * 17}, "stop"),
    ({"input_prefix": "word " * 3000}, "input_prefix"),
    ({"model": MODEL}, "input_suffix"),  # a model without FIM tokens
])
def test_bad_input_is_a_400_naming_the_parameter(daemon, body, param):
    r = infill(daemon.url, **{"input_prefix": "a", "input_suffix": "b", "n_predict": 2, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == 400  # llama-server's error shape


def metric_lines(url: str, name: str) -> list[tuple[str, float]]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return [(m.group(1), float(m.group(2))) for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)]


def lanes_active(url: str) -> float:
    return sum(v for _, v in metric_lines(url, "superfluid_lanes_active"))


def classes_running(url: str) -> set[str]:
    return {re.search(r'class="(\w+)"', labels).group(1) for labels, v in metric_lines(url, "superfluid_lanes_running")
            if v > 0}


def decoded(url: str) -> float:
    return sum(v for _, v in metric_lines(url, "superfluid_decode_tokens_total"))


CUTS: list[float] = []  # seconds from hanging up to a free lane


def drop_mid_stream(url: str, path: str, body: dict, n: int, headers: dict | None = None) -> set[str]:
    """Start a streamed generation of `n` tokens, read its first piece, note the running
    classes, hang up: the lane is freed and the generation cut, far short of its n tokens."""
    before = decoded(url)
    with httpx.stream("POST", url + path, json=body, headers=headers or {}, timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # held: an iterator let go of closes the connection
        while not next(lines).startswith("data: "):
            pass
        running = classes_running(url)
    t0 = time.monotonic()
    while lanes_active(url) and time.monotonic() < t0 + 120:  # waiting, not timing: the count below decides
        time.sleep(0.05)
    CUTS.append(time.monotonic() - t0)
    assert lanes_active(url) == 0
    assert decoded(url) - before < n / 2  # cut, not run to its end
    return running


def test_a_dropped_completion_frees_its_lane_and_fim_runs_in_the_completion_class(daemon):
    url, long = daemon.url, {"temperature": 0, "ignore_eos": True, "stream": True}
    n = CTX - 64
    fim_body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": n, **long}
    assert drop_mid_stream(url, "/infill", fim_body, n) == {"completion"}
    assert drop_mid_stream(url, "/infill", fim_body, n, {"x-superfluid-qos": "background"}) == {"background"}
    oa = {"model": FIM, "prompt": PREFIX, "max_tokens": n, **long}
    assert drop_mid_stream(url, "/v1/completions", {**oa, "suffix": SUFFIX}, n) == {"completion"}
    assert drop_mid_stream(url, "/v1/completions", oa, n) == {"agent"}  # no suffix: the server's default class
    print(f"hang-up to free lane: {', '.join(f'{s:.2f}' for s in CUTS)} s")


def test_a_dropped_whole_answer_is_cut_too(daemon):
    """Not streamed: the editor times out and closes; the daemon notices the hang-up while it
    waits for the answer and cancels the generation."""
    url, n = daemon.url, CTX - 64
    before = decoded(url)
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": n, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/infill", json=body, timeout=httpx.Timeout(120, read=3))
    t0 = time.monotonic()
    while lanes_active(url) and time.monotonic() < t0 + 120:
        time.sleep(0.05)
    assert lanes_active(url) == 0 and decoded(url) - before < n / 2
    print(f"whole answer: lane free {time.monotonic() - t0:.2f} s after the hang-up")
