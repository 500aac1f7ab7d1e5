"""OpenAI chat completions against the real daemon + worker, through the official client."""

import asyncio

import httpx
import openai
import pytest

from .conftest import MODEL

HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
PROMPTS = ["Write a haiku about the sea.", "Count from one to ten.", "Tell me a joke.",
           "What is 2+2?", "Name three colors.", "Who wrote Hamlet?", "Describe a cat.",
           "Give me a tip for sleeping well."]


def chat(client, content, **kw):
    kw.setdefault("max_tokens", 16)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def test_non_streaming(client):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.model == MODEL
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.message.content and c.message.content.strip()
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_system_and_assistant_turns(client):
    msgs = [{"role": "system", "content": "You answer in French."},
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": [{"type": "text", "text": "How are you?"}]}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
    assert r.choices[0].message.content
    solo = client.chat.completions.create(model=MODEL, messages=msgs[-1:], max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens > solo.usage.prompt_tokens  # the history reached the model


def test_streaming_grammar(client):
    stream = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.usage is not None and last.usage.completion_tokens >= 1
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10, temperature=0)
    assert text == whole.choices[0].message.content


def test_stream_ends_with_done_and_usage_chunk(daemon):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # sampled: an end of turn may come within 4 tokens
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    import json
    usage_chunk = json.loads(lines[-2][len("data: "):])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 4


def test_max_tokens_gives_length(client):
    r = chat(client, "Write a long story about a dragon.", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    r = chat(client, "Write a long story about a dragon.", max_completion_tokens=3, temperature=0, max_tokens=None)
    assert r.usage.completion_tokens == 3


def test_greedy_is_deterministic_alone_and_in_a_batch(daemon, client):
    alone = [chat(client, p, max_tokens=24, temperature=0).choices[0].message.content for p in PROMPTS]
    again = chat(client, PROMPTS[0], max_tokens=24, temperature=0).choices[0].message.content
    assert again == alone[0]

    async def batch():
        ac = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key="x", max_retries=0, timeout=120)
        rs = await asyncio.gather(*(ac.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=24, temperature=0)
            for p in PROMPTS))
        await ac.close()
        return [r.choices[0].message.content for r in rs]

    assert asyncio.run(batch()) == alone


def test_seed_determinism_with_temperature(client):
    kw = dict(max_tokens=20, temperature=1.0, top_p=0.95)
    a = chat(client, "Invent a name for a pet.", seed=1234, **kw).choices[0].message.content
    b = chat(client, "Invent a name for a pet.", seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {chat(client, "Invent a name for a pet.", seed=s, **kw).choices[0].message.content
              for s in (1, 2, 3)}
    assert len(others | {a}) > 1  # different seeds draw differently


PENALTIES = {"presence_penalty": 0.5, "frequency_penalty": 0.5}


def test_sampling_params_take_effect(client):
    """OpenAI's sampling fields and vLLM's top_k / min_p reach the sampler: all of them with a
    seed give the same text twice; top_k 1, min_p 1 or a tiny top_p each leave only the
    likeliest token, so a hot draw gives the greedy text (penalties and all), which the same
    draw without them does not; an unknown field is ignored."""
    kw = dict(temperature=0.7, top_p=0.9, seed=7, **PENALTIES)
    extra = {"top_k": 20, "min_p": 0.05, "some_unknown_field": 1}
    a, b = (chat(client, "Name a fruit.", **kw, extra_body=extra) for _ in range(2))
    assert a.choices[0].message.content and a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].finish_reason in ("stop", "length")
    assert 1 <= a.usage.completion_tokens <= 16 and a.usage.prompt_tokens > 5
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens

    greedy = chat(client, "Name a fruit.", temperature=0, **PENALTIES).choices[0].message.content
    hot = dict(temperature=1.5, seed=3, **PENALTIES)
    assert chat(client, "Name a fruit.", **hot).choices[0].message.content != greedy  # this seed's draw
    for only_top in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-6}):
        r = chat(client, "Name a fruit.", **hot, extra_body=only_top)
        assert r.choices[0].message.content == greedy, only_top


@pytest.mark.parametrize("field,value", [("temperature", -1), ("temperature", 2.5), ("top_p", 2), ("top_p", 0),
                                         ("top_k", -1), ("min_p", 2), ("presence_penalty", 3),
                                         ("frequency_penalty", -3), ("seed", "x")])
def test_an_out_of_range_sampling_param_is_a_400_naming_it(client, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "Name a fruit.", extra_body={field: value})
    assert e.value.status_code == 400
    assert e.value.body["param"] == field and e.value.body["type"] == "invalid_request_error"


def test_n_choices(client):
    r = chat(client, "Invent a word.", n=3, temperature=1.0, seed=5, max_tokens=8)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1
    assert 3 <= r.usage.completion_tokens <= 24  # summed over the choices


def test_stop_string_split_across_tokens(client):
    base = chat(client, "Count from one to twenty, separated by commas.", max_tokens=40, temperature=0,
                logprobs=True)
    toks = [t.token for t in base.choices[0].logprobs.content]
    text = base.choices[0].message.content
    assert "".join(toks) == text
    # a stop string made of the end of one token and the start of the next
    for k in range(3, len(toks) - 1):
        a, b = toks[k], toks[k + 1]
        if len(a) >= 2 and len(b) >= 2:
            stop = a[-2:] + b[:2]
            at = text.find(stop)
            if at >= sum(len(t) for t in toks[:k]):
                break
    else:
        raise AssertionError(f"no usable token boundary in {toks}")
    r = chat(client, "Count from one to twenty, separated by commas.", max_tokens=40, temperature=0,
             stop=[stop, "never-appears"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[:at]
    # streamed, the stop string never leaks either
    s = chat(client, "Count from one to twenty, separated by commas.", max_tokens=40, temperature=0,
             stop=stop, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
    assert streamed == text[:at]


def test_logprobs(client):
    r = chat(client, "Say yes.", max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    for t in content:
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        # greedy picks the most likely token
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6


def test_models_and_health(daemon, client):
    ids = [m.id for m in client.models.list()]
    assert ids == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    h = httpx.get(daemon.url + "/health").json()
    assert h["status"] == "ok"
    assert MODEL in daemon.banner and daemon.url.split("//")[1] in daemon.banner
    # the first line is the build it runs on (docs/gpu.md): here a CPU build, every layer on the CPU
    assert "llama.cpp" in daemon.startup[0] and "backends" in daemon.startup[0] and "CPU" in daemon.startup[0]
    assert "layers on the CPU only" in daemon.startup[0], daemon.startup
    assert h["models"][MODEL]["device"] == {"devices": ["CPU"], "layers": 0}
    card = httpx.get(daemon.url + "/v1/models").json()["data"][0]
    assert card["device"] == {"devices": ["CPU"], "layers": 0}
    assert [m["size_vram"] for m in httpx.get(daemon.url + "/api/ps").json()["models"]] == [0]


def test_completions(client):
    r = client.completions.create(model=MODEL, prompt="The capital of Italy is", max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text
    assert r.usage.completion_tokens <= 6
    s = client.completions.create(model=MODEL, prompt="The capital of Italy is", max_tokens=6, temperature=0,
                                  stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text
    lp = client.completions.create(model=MODEL, prompt="One, two,", max_tokens=3, temperature=0, logprobs=2)
    assert len(lp.choices[0].logprobs.tokens) == len(lp.choices[0].logprobs.token_logprobs) >= 1


def test_tokenize_roundtrip(daemon):
    r = httpx.post(daemon.url + "/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
    assert r["count"] == len(r["tokens"]) >= 2
    assert "".join(t["piece"] for t in r["tokens"]) == "Hello world"  # llama-server's [{id, piece}]
    d = httpx.post(daemon.url + "/detokenize", json={"tokens": [t["id"] for t in r["tokens"]]}).json()
    assert d["content"] == "Hello world"


def test_streaming_with_n_choices(client):
    s = chat(client, "Invent a word.", n=2, temperature=1.0, seed=9, max_tokens=6, stream=True)
    texts, finishes = {0: "", 1: ""}, {}
    for c in s:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert set(finishes) == {0, 1}
    whole = chat(client, "Invent a word.", n=2, temperature=1.0, seed=9, max_tokens=6)
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]
