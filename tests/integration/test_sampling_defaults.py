"""Sampling defaults on a real daemon: a copy of the embedded model whose GGUF recommends
sampling (general.sampling.temp 0, penalty_repeat 5, penalty_last_n 64), served with
`--repeat-last-n 0`: the model's recommendation applies where no flag and no request value
is given, the flag wins over the model, and the request over both, on every API."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from ..scratch import scratch
from .daemon import Daemon

REPEAT = "Say cat. cat cat cat cat cat"  # greedy goes on with " cat"
RECOMMENDED = {"general.sampling.temp": 0.0, "general.sampling.penalty_repeat": 5.0,
               "general.sampling.penalty_last_n": 64}


def recommending_gguf(out: Path) -> str:
    """The embedded model, byte for byte, plus llama.cpp's recommended-sampling keys."""
    import gguf

    from superfluid.runtime.registry import embedded_model

    r = gguf.GGUFReader(embedded_model().path)
    w = gguf.GGUFWriter(str(out), str(r.fields["general.architecture"].contents()))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    w.add_float32("general.sampling.temp", RECOMMENDED["general.sampling.temp"])
    w.add_float32("general.sampling.penalty_repeat", RECOMMENDED["general.sampling.penalty_repeat"])
    w.add_int32("general.sampling.penalty_last_n", RECOMMENDED["general.sampling.penalty_last_n"])
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(out)


@pytest.fixture(scope="module")
def d():
    path = recommending_gguf(Path(scratch("superfluid-sampling-")) / "SmolLM2-recommends.gguf")
    dm = Daemon(path, "--repeat-last-n", "0", max_batch=2, max_context=512)
    yield dm
    dm.stop()


@pytest.fixture(scope="module")
def oa(d):
    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_models_temperature_applies_when_the_request_gives_none(oa):
    kw = {"model": "x", "prompt": "Once upon a time", "max_tokens": 12}
    greedy = oa.completions.create(**kw, temperature=0).choices[0].text
    assert [oa.completions.create(**kw, seed=s).choices[0].text for s in (1, 2, 3)] == [greedy] * 3


def test_the_flag_wins_over_the_model_and_the_request_over_both(d, oa):
    kw = {"model": "x", "prompt": REPEAT, "max_tokens": 2}
    # --repeat-last-n 0 turns the model's repeat penalty off
    assert oa.completions.create(**kw).choices[0].text.startswith(" cat")
    # the request's window turns it back on: the model's penalty_repeat 5 applies
    assert not oa.completions.create(**kw, extra_body={"repeat_last_n": 64}).choices[0].text.startswith(" cat")
    assert oa.completions.create(**kw, extra_body={"repeat_last_n": 64, "repeat_penalty": 1.0}) \
        .choices[0].text.startswith(" cat")


def test_llama_server_and_ollama_take_the_same_defaults(d):
    def completion(**kw) -> str:
        r = httpx.post(d.url + "/completion", json={"prompt": REPEAT, "n_predict": 2, **kw}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["content"]

    def ollama(**opts) -> str:
        r = httpx.post(d.url + "/api/generate", json={"model": "x", "prompt": REPEAT, "raw": True, "stream": False,
                                                     "options": {"num_predict": 2, **opts}}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["response"]
    for gen in (completion, ollama):
        assert gen().startswith(" cat")  # greedy (the model's temperature), no penalty (the flag)
        assert gen() == gen()
        assert not gen(repeat_last_n=64).startswith(" cat")


def test_props_show_the_defaults_a_request_gets(d):
    params = httpx.get(d.url + "/props", timeout=30).json()["default_generation_settings"]["params"]
    # the model's temperature and repeat penalty, the flag's window, llama-server's top_k
    assert (params["temperature"], params["repeat_penalty"], params["repeat_last_n"], params["top_k"]) == \
        (0.0, 5.0, 0, 40)
