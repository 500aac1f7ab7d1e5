"""Sampling parameters clients send, by their effect on greedy output on a real daemon:
logit_bias on OpenAI chat/completions and llama-server's /completion, penalties over the
context (and repeat_last_n) on OpenAI, /completion and Ollama, typical_p, seed
reproducibility, Ollama's options checking, logprobs, think levels, template and raw, and
each new field's limits as typed 400s."""

import json

import httpx
import openai
import pytest

from .daemon import Daemon

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def d():
    dm = Daemon(max_batch=2, max_context=512)
    yield dm
    dm.stop()


@pytest.fixture(scope="module")
def oa(d):
    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def tokens(d, text: str) -> list[int]:
    r = httpx.post(d.url + "/tokenize", json={"content": text}, timeout=60)
    return r.json()["tokens"]


def first_token(d, **extra) -> tuple[int, str]:
    """The first token /completion generates greedily (its id and the whole text)."""
    r = httpx.post(d.url + "/completion", json={"prompt": PROMPT, "temperature": 0, "n_predict": 4,
                                               "return_tokens": True, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["tokens"][0], r.json()["content"]


def test_completion_logit_bias_bans_and_forces(d):
    first, text = first_token(d)
    banned, _ = first_token(d, logit_bias=[[first, False]])
    assert banned != first
    assert first_token(d, logit_bias={str(first): -100})[0] != first
    forced = tokens(d, " banana")[0]
    assert forced != first
    assert first_token(d, logit_bias=[[forced, 100]])[0] == forced
    # text keys: every token of the text gets the bias
    assert first_token(d, logit_bias=[[" banana", 100]])[0] == forced


def test_openai_completions_logit_bias(d, oa):
    kw = {"model": "x", "prompt": PROMPT, "temperature": 0, "max_tokens": 3, "logprobs": 0}
    plain = oa.completions.create(**kw)
    first = plain.choices[0].logprobs.tokens[0]
    first_id = tokens(d, first)[0]
    banned = oa.completions.create(**kw, logit_bias={str(first_id): -100})
    assert banned.choices[0].logprobs.tokens[0] != first
    forced = tokens(d, " banana")[0]
    out = oa.completions.create(**kw, logit_bias={str(forced): 100})
    assert out.choices[0].text.startswith(" banana")


def test_chat_logit_bias_bans_the_greedy_first_token(d, oa):
    kw = {"model": "x", "messages": CHAT, "temperature": 0, "max_tokens": 4, "logprobs": True}
    plain = oa.chat.completions.create(**kw)
    first = plain.choices[0].logprobs.content[0]
    first_id = tokens(d, first.token)[0]
    banned = oa.chat.completions.create(**kw, logit_bias={str(first_id): -100})
    assert banned.choices[0].logprobs.content[0].token != first.token
    assert plain.system_fingerprint.startswith("fp_") and plain.system_fingerprint == banned.system_fingerprint


@pytest.mark.parametrize("bias", [{"5": 101}, {"5": -100.5}, {"99999999": 1}, {"word": 1},
                                  {str(i): 1 for i in range(301)}])
def test_openai_bad_logit_bias_is_a_400_naming_it(oa, bias):
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="x", messages=CHAT, max_tokens=1, logit_bias=bias)
    assert e.value.body["param"] == "logit_bias"


@pytest.mark.parametrize("bias", [[[5, 101]], [[10 ** 9, 1]], [[5]], {"5": "x"}])
def test_completion_bad_logit_bias_is_a_400_naming_it(d, bias):
    r = httpx.post(d.url + "/completion", json={"prompt": "x", "n_predict": 1, "logit_bias": bias}, timeout=60)
    assert r.status_code == 400, r.text
    assert "logit_bias" in r.text


def test_same_seed_same_output_and_different_seeds_differ(oa):
    kw = {"model": "x", "prompt": "Once upon a time", "temperature": 1.0, "max_tokens": 12}
    a = oa.completions.create(**kw, seed=11).choices[0].text
    assert oa.completions.create(**kw, seed=11).choices[0].text == a
    others = {oa.completions.create(**kw, seed=s).choices[0].text for s in (12, 13, 14)}
    assert others - {a}


# -- penalties over the context ------------------------------------------------------------

REPEAT = "Say cat. cat cat cat cat cat"  # greedy goes on with " cat"


def cat_first(d, **extra) -> bool:
    r = httpx.post(d.url + "/completion", json={"prompt": REPEAT, "temperature": 0, "n_predict": 2, **extra},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["content"].startswith(" cat")


def test_completion_penalties_count_the_prompt(d):
    assert cat_first(d)
    assert not cat_first(d, presence_penalty=5.0)  # the window's 64 tokens hold the prompt's cats
    assert not cat_first(d, repeat_penalty=5.0, repeat_last_n=-1)
    assert not cat_first(d, repeat_penalty=5.0, repeat_last_n=1)  # the last token is " cat"
    assert cat_first(d, presence_penalty=5.0, repeat_last_n=0)  # 0: penalties off


def test_openai_penalties_count_the_prompt(oa):
    kw = {"model": "x", "prompt": REPEAT, "temperature": 0, "max_tokens": 2}
    assert oa.completions.create(**kw).choices[0].text.startswith(" cat")
    out = oa.completions.create(**kw, presence_penalty=2.0, frequency_penalty=2.0).choices[0].text
    assert not out.startswith(" cat")
    # vLLM's extra body fields
    out = oa.completions.create(**kw, extra_body={"repetition_penalty": 5.0}).choices[0].text
    assert not out.startswith(" cat")
    out = oa.completions.create(**kw, extra_body={"repetition_penalty": 5.0, "repeat_last_n": 0}).choices[0].text
    assert out.startswith(" cat")


def test_ollama_penalties_count_the_prompt(d):
    def gen(**opts) -> str:
        r = httpx.post(d.url + "/api/generate", json={"model": "x", "prompt": REPEAT, "raw": True, "stream": False,
                                                     "options": {"temperature": 0, "num_predict": 2, **opts}},
                       timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["response"]
    assert gen(repeat_penalty=1.0).startswith(" cat")
    assert not gen(repeat_penalty=5.0).startswith(" cat")
    assert gen(repeat_penalty=5.0, repeat_last_n=0).startswith(" cat")


@pytest.mark.parametrize("extra,param", [({"typical_p": 0}, "typical_p"), ({"typical_p": 1.5}, "typical_p"),
                                         ({"repeat_last_n": -2}, "repeat_last_n"),
                                         ({"repetition_penalty": 0}, "repetition_penalty")])
def test_openai_bad_extras_are_400s(oa, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oa.completions.create(model="x", prompt="x", max_tokens=1, extra_body=extra)
    assert e.value.body["param"] == param


def test_typical_p_is_accepted_everywhere(d, oa):
    assert oa.completions.create(model="x", prompt="Hi", max_tokens=2, seed=1,
                                 extra_body={"typical_p": 0.5}).choices[0].text is not None
    r = httpx.post(d.url + "/completion", json={"prompt": "Hi", "n_predict": 2, "typical_p": 0.5}, timeout=60)
    assert r.status_code == 200 and r.json()["generation_settings"]["typical_p"] == 0.5
    r = httpx.post(d.url + "/api/generate", json={"model": "x", "prompt": "Hi", "stream": False,
                                                 "options": {"num_predict": 2, "typical_p": 0.5}}, timeout=60)
    assert r.status_code == 200, r.text


# -- Ollama options ------------------------------------------------------------------------

@pytest.mark.parametrize("opts,param", [({"temprature": 0.5}, "options.temprature"),
                                        ({"typical_p": 0}, "options.typical_p"),
                                        ({"repeat_last_n": -5}, "options.repeat_last_n"),
                                        ({"top_p": 2}, "options.top_p")])
def test_ollama_bad_options_are_400s_naming_them(d, opts, param):
    for path, body in (("/api/generate", {"prompt": "Hi"}), ("/api/chat", {"messages": CHAT})):
        r = httpx.post(d.url + path, json={"model": "x", "stream": False, "options": opts, **body}, timeout=60)
        assert r.status_code == 400, r.text
        assert param in r.json()["error"]


def test_ollama_accepts_runner_options_and_old_ones(d):
    r = httpx.post(d.url + "/api/generate", json={"model": "x", "prompt": "Hi", "stream": False, "options": {
        "num_predict": 1, "num_ctx": 2048, "num_thread": 2, "tfs_z": 1.0, "mirostat": 0}}, timeout=60)
    assert r.status_code == 200, r.text


# -- Ollama logprobs, think, template ------------------------------------------------------

def ollama_post(d, path: str, **body) -> httpx.Response:
    return httpx.post(d.url + path, json={"model": "x", **body}, timeout=120)


def test_ollama_logprobs_whole_and_streamed(d):
    opts = {"temperature": 0, "num_predict": 4}
    r = ollama_post(d, "/api/generate", prompt="Hi", stream=False, options=opts, logprobs=True, top_logprobs=3)
    assert r.status_code == 200, r.text
    lps = r.json()["logprobs"]
    assert 1 <= len(lps) <= 4 and "".join(lp["token"] for lp in lps) == r.json()["response"]
    for lp in lps:
        assert lp["logprob"] <= 0 and bytes(lp["bytes"]).decode("utf-8", "replace") == lp["token"]
        tops = lp["top_logprobs"]
        assert len(tops) == 3 and tops[0]["logprob"] >= tops[-1]["logprob"]
        assert tops[0]["token"] == lp["token"]  # greedy: the chosen token is the likeliest
    lines = [json.loads(x) for x in ollama_post(d, "/api/chat", messages=CHAT, options=opts,
                                                logprobs=True).text.splitlines()]
    streamed = [lp for line in lines for lp in line.get("logprobs", [])]
    assert streamed and all(lp["top_logprobs"] == [] for lp in streamed)
    plain = ollama_post(d, "/api/generate", prompt="Hi", stream=False, options=opts)
    assert "logprobs" not in plain.json()


@pytest.mark.parametrize("body,param", [({"logprobs": "yes"}, "logprobs"), ({"logprobs": True, "top_logprobs": 21},
                                                                           "top_logprobs"),
                                        ({"think": "extreme"}, "think"), ({"template": "{{ .Prompt }}"}, "template")])
def test_ollama_bad_fields_are_400s_naming_them(d, body, param):
    r = ollama_post(d, "/api/generate", prompt="Hi", stream=False, options={"num_predict": 1}, **body)
    assert r.status_code == 400 and param in r.json()["error"], r.text


def test_ollama_think_levels_are_accepted(d):
    for think in ("low", "high", False):
        r = ollama_post(d, "/api/chat", messages=CHAT, stream=False, think=think, options={"num_predict": 2})
        assert r.status_code == 200, r.text


def test_ollama_raw_sends_the_prompt_without_the_template(d):
    r = ollama_post(d, "/api/generate", prompt="One, two, three,", raw=True, stream=False,
                    options={"num_predict": 1})
    templated = ollama_post(d, "/api/generate", prompt="One, two, three,", stream=False, options={"num_predict": 1})
    assert r.json()["prompt_eval_count"] < templated.json()["prompt_eval_count"]


def test_session_api_takes_typical_p_and_repeat_last_n(d):
    r = httpx.post(d.url + "/v1/sessions", json={"typical_p": 0.5, "repeat_last_n": 8, "repeat_penalty": 1.2},
                   timeout=60)
    assert r.status_code == 201, r.text
    for bad, param in (({"repeat_last_n": -2}, "repeat_last_n"), ({"typical_p": 0}, "typical_p")):
        r = httpx.post(d.url + "/v1/sessions", json=bad, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
