"""The Ollama API through the official `ollama` Python client and plain HTTP."""

import json

import httpx
import ollama
import pytest

from .conftest import MODEL


@pytest.fixture(scope="module")
def oc(daemon):
    return ollama.Client(host=daemon.url)


def test_version_root_tags_ps_show(daemon, oc):
    assert httpx.get(daemon.url + "/").text == "Ollama is running"
    assert httpx.get(daemon.url + "/api/version").json()["version"]
    assert [m.model for m in oc.list().models] == [MODEL]
    assert [m.model for m in oc.ps().models] == [MODEL]
    s = oc.show(MODEL)
    assert "im_start" in s.template and s.modelinfo["general.architecture"] == "llama"


def test_chat_non_streaming_and_streaming(oc):
    msgs = [{"role": "user", "content": "Say hello."}]
    r = oc.chat(model=MODEL, messages=msgs, options={"temperature": 0, "num_predict": 8})
    assert r.message.role == "assistant" and r.message.content
    assert r.done and r.done_reason in ("stop", "length") and r.eval_count <= 8 and r.prompt_eval_count > 5
    parts = list(oc.chat(model=MODEL, messages=msgs, stream=True, options={"temperature": 0, "num_predict": 8}))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == r.message.content


def test_generate_with_options(oc):
    r = oc.generate(model=MODEL, prompt="Name a color.", options={"temperature": 0, "num_predict": 5, "seed": 3})
    assert r.response and r.eval_count == 5 and r.done_reason == "length"
    again = oc.generate(model=MODEL, prompt="Name a color.", options={"temperature": 0, "num_predict": 5})
    assert again.response == r.response
    raw = oc.generate(model=MODEL, prompt="One, two, three,", raw=True, options={"temperature": 0, "num_predict": 3})
    assert raw.prompt_eval_count < r.prompt_eval_count  # no chat template around it
    stop = oc.generate(model=MODEL, prompt="Count from one to ten with digits.",
                       options={"temperature": 0, "num_predict": 40, "stop": ["4"]})
    assert "4" not in stop.response


def test_ndjson_stream_by_default(daemon):
    with httpx.stream("POST", daemon.url + "/api/generate", timeout=60,
                      json={"model": MODEL, "prompt": "Hi", "options": {"num_predict": 3}}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        objs = [json.loads(ln) for ln in r.iter_lines() if ln]
    assert objs[-1]["done"] is True and objs[-1]["eval_count"] == 3


def test_preload_and_errors(daemon, oc):
    r = httpx.post(daemon.url + "/api/generate", json={"model": MODEL}).json()
    assert r["done"] and r["done_reason"] == "load"
    with pytest.raises(ollama.ResponseError) as e:
        oc.show("nope")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        oc.chat(model=MODEL, messages=[{"role": "user", "content": "x", "images": ["aGk="]}])
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        oc.pull(MODEL)  # not a Hugging Face name: nothing to pull (test_hub_pull.py pulls names)
    assert e.value.status_code == 400 and "Hugging Face name" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        oc.push(MODEL)
    assert e.value.status_code == 501
    r = httpx.post(daemon.url + "/api/embed", json={"model": MODEL, "input": 5})
    assert r.status_code == 400 and r.json() == {"error": "input must be a string or a list of 1 to 2048 strings"}
    r = httpx.post(daemon.url + "/api/generate", json={"model": MODEL, "prompt": 5, "stream": False})
    assert r.status_code == 400 and r.json() == {"error": "prompt must be a string"}  # (was answered as "5")
    r = httpx.post(daemon.url + "/api/chat", content=b"{bad")
    assert r.status_code == 400 and "JSON" in r.json()["error"]
