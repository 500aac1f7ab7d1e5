"""`superfluid serve --runtime transformers` end to end: the daemon tokenizes with the GGUF's
vocabulary, the worker runs the converted model; greedy chat completions (plain, streamed,
several at once) equal a plain `model.generate` on the rendered prompt."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from . import hf  # noqa: E402
from .daemon import Daemon  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
N = 16


@pytest.fixture(scope="module")
def client():
    hf.folder()  # converted once into the home the daemon uses
    d = Daemon("--runtime", "transformers", home=str(hf.HOME), max_context=512, max_batch=4)
    yield openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    d.stop()


def expected(question: str) -> tuple[str, int]:
    prompt = hf.chat_prompt(question)
    toks = hf.generate(prompt, N)
    if toks and toks[-1] in hf.EOG:
        toks = toks[:-1]
    return hf.tokenizer().decode(toks), len(prompt)


def ask(client, question: str) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          temperature=0, max_tokens=N)


def test_greedy_chat_equals_generate(client):
    q = "What is the capital of France?"
    text, n_prompt = expected(q)
    r = ask(client, q)
    assert r.usage.prompt_tokens == n_prompt
    assert r.choices[0].message.content == text


def test_streaming_equals_generate(client):
    q = "Write one sentence about the sea."
    text, _ = expected(q)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}],
                                            temperature=0, max_tokens=N, stream=True)
    got = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert got == text


def test_concurrent_requests_equal_generate(client):
    qs = ["Name a color.", "Say hello in French.", "What is two plus two?"]
    with concurrent.futures.ThreadPoolExecutor(len(qs)) as pool:
        got = list(pool.map(lambda q: ask(client, q).choices[0].message.content, qs))
    assert got == [expected(q)[0] for q in qs]
