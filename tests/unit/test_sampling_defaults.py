"""Sampling defaults: the request's value, then the operator's flag, then the model's GGUF
recommendation, then the API's documented default (superfluid/sampling_defaults.py)."""

import argparse

import pytest

from superfluid.api.llama_params import options
from superfluid.api.ollama_options import sampling
from superfluid.api.openai import gen_requests
from superfluid.api.schema import CompletionRequest
from superfluid.request import Qos
from superfluid.engine.sampling_defaults import add_flags, for_api, from_args, from_gguf, merged

GGUF = {"general.sampling.temp": "0.6", "general.sampling.top_k": "20", "general.sampling.top_p": "0.95",
        "general.sampling.min_p": "0", "general.sampling.penalty_repeat": "1.05",
        "general.sampling.penalty_last_n": "128"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_flags(p)
    return p


def test_gguf_keys_are_read_and_bad_values_left_out():
    assert from_gguf(GGUF.get) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0,
                                   "repeat_penalty": 1.05, "repeat_last_n": 128}
    assert from_gguf({"general.sampling.temp": "hot", "general.sampling.top_k": "2.5",
                      "general.sampling.top_p": "7"}.get) == {}
    assert from_gguf(lambda k: None) == {}


def test_flags_parse_with_llama_server_spellings():
    args = parser().parse_args(["--temp", "0.2", "--top-k", "5", "--repeat-penalty", "1.3", "--typical", "0.9"])
    assert dict(from_args(args)) == {"temperature": 0.2, "top_k": 5, "repeat_penalty": 1.3, "typical_p": 0.9}
    assert from_args(parser().parse_args([])) == ()


@pytest.mark.parametrize("argv", [["--temperature", "3"], ["--top-p", "0"], ["--top-k", "1.5"],
                                  ["--repeat-last-n", "-2"], ["--min-p", "x"]])
def test_flags_out_of_range_are_refused(argv):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)


def test_precedence_request_then_flag_then_model_then_api():
    engine = merged(from_gguf(GGUF.get), (("temperature", 0.3),))
    assert engine["temperature"] == 0.3 and engine["top_k"] == 20  # the flag over the model
    d = for_api({"temperature": 0.8, "top_k": 40, "typical_p": 1.0}, engine)
    assert (d["temperature"], d["top_k"], d["typical_p"]) == (0.3, 20, 1.0)


def test_every_api_uses_the_engine_defaults_under_the_request():
    engine = {"temperature": 0.3, "top_k": 7, "repeat_penalty": 1.2, "repeat_last_n": 16}
    # OpenAI
    body = CompletionRequest.model_validate({"prompt": "x"})
    sp = gen_requests(body, [1], base_id="c", n_ctx=64, seed=1, default_max=4, top_logprobs=-1,
                      qos=Qos.AGENT, defaults=engine)[0].sampling
    assert (sp.temperature, sp.top_k, sp.repeat_penalty, sp.repeat_last_n, sp.top_p) == (0.3, 7, 1.2, 16, 1.0)
    body = CompletionRequest.model_validate({"prompt": "x", "temperature": 0.9, "repeat_penalty": 1.0})
    sp = gen_requests(body, [1], base_id="c", n_ctx=64, seed=1, default_max=4, top_logprobs=-1,
                      qos=Qos.AGENT, defaults=engine)[0].sampling
    assert (sp.temperature, sp.repeat_penalty) == (0.9, 1.0)
    # llama-server
    sp = options({}, None, engine).sampling
    assert (sp.temperature, sp.top_k, sp.top_p, sp.repeat_last_n) == (0.3, 7, 0.95, 16)
    assert options({"top_k": 3}, None, engine).sampling.top_k == 3
    # Ollama
    sp, _, _ = sampling({}, 1, engine)
    assert (sp.temperature, sp.top_k, sp.top_p, sp.repeat_penalty) == (0.3, 7, 0.9, 1.2)
    assert sampling({"temperature": 0.0}, 1, engine)[0].temperature == 0.0
