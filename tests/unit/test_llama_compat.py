"""The pure parts of llama-server compatibility: model names (Models.resolve_id), its flags
(llama_flags.py) and /completion's options (api/llama_params.py)."""

import pytest

from superfluid.api.llama_params import budget, options
from superfluid.cli.main import parser
from superfluid.config import EngineConfig
from superfluid.errors import BadRequest, ContextLengthExceeded, ModelLoadError, ModelNotFound
from superfluid.cli.llama_flags import apply_flags
from superfluid.service.registry import Models
from superfluid.runtime.registry import ModelSource


def models(*ids: str, strict: bool = False) -> Models:
    m = Models(EngineConfig(model_path="a.gguf", model_id=ids[0]), build=lambda ec: None, strict=strict)
    for i in ids:
        m.add(ModelSource(f"/m/{i}.gguf", i))
    return m


def test_names_with_one_model():
    m = models("Small")
    m.alias("gpt-4o")
    assert m.resolve_id(None) == "Small" and m.resolve_id("small") == "Small" and m.resolve_id("GPT-4O") == "Small"
    assert m.resolve_id("gpt-3.5-turbo", fallback=True) == "Small"
    with pytest.raises(ModelNotFound):
        m.resolve_id("gpt-3.5-turbo")  # the catalogue and admin routes name real models


def test_strict_or_several_models_refuse_unknown_names():
    for m in (models("Small", strict=True), models("Small", "Big")):
        with pytest.raises(ModelNotFound):
            m.resolve_id("gpt-3.5-turbo", fallback=True)
    m = models("Small", "Big")
    m.alias("fast", "small")
    assert m.resolve_id("fast", fallback=True) == "Small" and m.resolve_id(None) == "Small"
    with pytest.raises(ModelLoadError):
        m.alias("x", "nope")
    with pytest.raises(ModelLoadError):
        m.alias("big")  # a served model's own name stands for itself


def test_llama_server_flags():
    a = parser().parse_args(["serve", "-m", "x.gguf", "-c", "512", "-np", "2", "-t", "3", "--jinja",
                             "--alias", "gpt-4o,fast=Big", "-a", "z", "--api-key", "sk-12345678"])
    assert apply_flags(a) is None
    assert (a.model, a.max_context, a.max_batch, a.threads, a.api_key) == ("x.gguf", 512, 2, 3, "sk-12345678")
    assert a.aliases == [("gpt-4o", None), ("fast", "Big"), ("z", None)]
    a = parser().parse_args(["serve", "-c", "0", "-np", "-1", "-t", "-1", "--max-batch", "4"])
    assert apply_flags(a) is None and a.max_context is None and a.max_batch == 4 and a.model is None
    a = parser().parse_args(["serve", "a.gguf", "-m", "b.gguf"])
    assert apply_flags(a) == "give the model once: as MODEL, -m or -hf (-m)"
    a = parser().parse_args(["serve", "-ctk", "q8_0", "-ctv", "q8_0"])
    assert apply_flags(a) is None and a.kv_bits == 8
    a = parser().parse_args(["serve", "--cache-type-k", "q4_0"])
    assert "K and V together" in apply_flags(a)
    a = parser().parse_args(["serve", "-ctk", "q4_0", "-ctv", "q4_0", "--kv-bits", "8"])
    assert "disagree" in apply_flags(a)
    a = parser().parse_args(["serve", "-hf", "Qwen/Qwen3-4B-GGUF:Q4_K_M"])
    assert apply_flags(a) is None and a.model == "Qwen/Qwen3-4B-GGUF:Q4_K_M"
    a = parser().parse_args(["serve", "-m", "b.gguf", "--hf-repo", "o/r"])
    assert apply_flags(a) == "give the model once: as MODEL, -m or -hf (-hf)"
    for bad in (["-np", "-2"], ["-c", "x"], ["--alias", "=x"], ["--alias", "a="]):
        with pytest.raises(SystemExit):
            parser().parse_args(["serve", *bad])


def test_completion_options_defaults_and_samplers():
    o = options({})
    sp = o.sampling
    assert (sp.temperature, sp.top_k, sp.top_p, sp.min_p, o.n_predict, o.seed) == (0.8, 40, 0.95, 0.05, -1, None)
    o = options({"temperature": -1, "top_k": -1, "seed": 4294967295, "samplers": "kt", "max_tokens": 5})
    sp = o.sampling
    assert (sp.temperature, sp.top_k, sp.top_p, sp.min_p, o.seed, o.n_predict) == (0.0, 0, 1.0, 0.0, None, 5)
    assert options({"samplers": ["top_p"], "top_p": 0.5, "seed": 3}).sampling.top_k == 0
    assert options({"seed": 3, "n_predict": 2, "max_tokens": 9}).n_predict == 2  # n_predict wins
    assert options({"top_p": 0}).sampling.temperature == 0.0  # only the likeliest token survives
    assert options({"n_probs": 3}).sampling.top_logprobs == 3


@pytest.mark.parametrize("body,param", [
    ({"n_predict": -2}, "n_predict"), ({"n_predict": True}, "n_predict"), ({"temperature": "x"}, "temperature"),
    ({"top_p": 1.5}, "top_p"), ({"stop": "x" * 257}, "stop"), ({"stop": ["a"] * 17}, "stop"),
    ({"samplers": ["x"] * 33}, "samplers"), ({"samplers": "kq"}, "samplers"), ({"n_probs": 21}, "n_probs"),
    ({"n_cmpl": 2}, "n_cmpl"), ({"logit_bias": {"1": -100}}, "logit_bias"), ({"stream": "yes"}, "stream"),
    ({"grammar": "root ::= missing"}, "grammar"), ({"json_schema": 3}, "json_schema"),
    ({"response_fields": [1]}, "response_fields"), ({"seed": -5}, "seed")])
def test_bad_options_name_the_field(body, param):
    with pytest.raises(BadRequest) as e:
        options(body)
    assert e.value.param == param


def test_budget():
    assert budget(-1, 10, 100) == 90 and budget(500, 10, 100) == 90 and budget(5, 10, 100) == 5
    with pytest.raises(ContextLengthExceeded):
        budget(5, 100, 100)
