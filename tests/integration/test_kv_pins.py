"""Pins and client cache hints through the real daemon: Anthropic cache_control usage fields
(official `anthropic` client), a pinned session outliving eviction pressure (the disk tier off,
so only memory could keep it), the pin share's typed error, and Ollama keep_alive loading and
unloading a model (official `ollama` client)."""

import os
import time
from datetime import UTC, datetime, timedelta

import anthropic
import httpx
import ollama
import pytest

from superfluid.runtime.registry import embedded_model

from .conftest import MODEL
from .daemon import Daemon

SYSTEM = ("Zephyrine the cartographer draws maps of islands that drift across the northern sea; "
          "she answers travellers briefly and never invents a coast she has not charted.")
TOPICS = ["Quartz", "Bicycles", "Volcanoes", "Jazz", "Origami", "Glaciers"]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    os.symlink(embedded_model().path, models / "alpha.gguf")
    # one lane, three slots: two may be pinned; no disk tier, so only a pin keeps a context warm
    daemon = Daemon("--kv-disk", "off", "--kv-slots", "3", "--model-dir", str(models), max_batch=1, max_context=1024)
    yield daemon
    daemon.stop()


def test_cache_control_usage(d):
    ac = anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0, timeout=120)
    kw = dict(model=MODEL, max_tokens=4, extra_body={"temperature": 0},
              system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
              messages=[{"role": "user", "content": "Where do the islands drift?"}])
    total = ac.messages.count_tokens(model=MODEL, system=SYSTEM, messages=kw["messages"]).input_tokens
    first = ac.messages.create(**kw).usage
    assert first.cache_creation_input_tokens > 20 and first.cache_read_input_tokens == 0
    assert first.input_tokens + first.cache_creation_input_tokens == total
    second = ac.messages.create(**kw).usage  # the same prompt: read from cache, nothing written
    assert second.cache_read_input_tokens >= first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens == 0
    assert second.input_tokens + second.cache_read_input_tokens == total
    with ac.messages.stream(**kw) as s:  # the stream's message_delta carries the same split
        streamed = s.get_final_message().usage
    assert streamed.cache_read_input_tokens == second.cache_read_input_tokens
    assert streamed.input_tokens == second.input_tokens
    with pytest.raises(anthropic.BadRequestError):
        ac.messages.create(**{**kw, "system": [{"type": "text", "text": SYSTEM,
                                                "cache_control": {"type": "ephemeral", "ttl": "2d"}}]})


def session(d, topic: str) -> str:
    r = httpx.post(d.url + "/v1/sessions", json={"model": MODEL, "system": f"{topic} are the subject here.",
                                                 "temperature": 0})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def say(d, sid: str, text: str) -> int:
    """A user message and a 4-token reply; returns the reply's cached prompt tokens."""
    assert httpx.post(d.url + f"/v1/sessions/{sid}/messages", json={"role": "user", "content": text}).status_code == 200
    r = httpx.post(d.url + f"/v1/sessions/{sid}/generate", json={"max_tokens": 4, "stream": False}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["cached_tokens"]


def test_a_pinned_session_outlives_eviction_pressure(d):
    a, b = session(d, "Lighthouses"), session(d, "Orchards")
    say(d, a, "Tell me one fact.")
    say(d, b, "Tell me one fact.")
    r = httpx.post(d.url + f"/v1/sessions/{a}/pin")
    assert r.status_code == 200 and r.json()["pinned"] and r.json()["warm_tokens"] > 10
    for topic in TOPICS:  # more conversations than slots
        say(d, session(d, topic), "Hello.")
    assert say(d, a, "Another one.") > 20  # its context stayed in its slot
    assert say(d, b, "Another one.") == 0  # the unpinned one was evicted
    # the share: kv-slots 3 - max-batch 1 = 2 pinned sessions
    assert httpx.post(d.url + f"/v1/sessions/{b}/pin").status_code == 200
    r = httpx.post(d.url + f"/v1/sessions/{session(d, 'Kites')}/pin")
    assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_pins"
    r = httpx.post(d.url + f"/v1/sessions/{b}/unpin")
    assert r.status_code == 200 and r.json()["was_pinned"] and not r.json()["pinned"]


def loaded(oc) -> dict:
    return {m.model: m for m in oc.ps().models}


def test_keep_alive_loads_and_unloads_a_model(d):
    oc = ollama.Client(host=d.url, timeout=120)
    r = oc.generate(model="alpha", prompt="Hi", options={"num_predict": 2, "temperature": 0}, keep_alive=0)
    assert r.done
    deadline = time.monotonic() + 10
    while "alpha" in loaded(oc) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "alpha" not in loaded(oc)  # unloaded once the request was done
    # an empty request loads it and keeps it for its keep_alive; -1 keeps it forever
    assert oc.generate(model="alpha", keep_alive="10m").done_reason == "load"
    expires = loaded(oc)["alpha"].expires_at
    assert timedelta(minutes=9) < expires - datetime.now(UTC) < timedelta(minutes=11)
    oc.chat(model="alpha", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}, keep_alive=-1)
    assert loaded(oc)["alpha"].expires_at.year > 2200
    # an empty request with keep_alive 0 just unloads (Ollama's documented way)
    assert oc.chat(model="alpha", messages=[], keep_alive="0s").done_reason == "unload"
    assert "alpha" not in loaded(oc)
    # the default model stays loaded whatever keep_alive says (/health reports ready on it)
    oc.generate(model=MODEL, prompt="Hi", options={"num_predict": 2}, keep_alive=0)
    time.sleep(2)
    assert MODEL in loaded(oc) and d.health()["status"] == "ok"
    with pytest.raises(ollama.ResponseError) as e:
        oc.generate(model=MODEL, prompt="Hi", keep_alive="soon")
    assert e.value.status_code == 400
