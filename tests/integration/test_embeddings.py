"""Embeddings and rerank on a real daemon: the default GGUF (llama.cpp), the embedded
all-MiniLM-L6-v2 (--embedding-model default, transformers) and a tiny cross-encoder, through
the official openai and ollama clients and plain HTTP."""

import base64
import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import ollama
import openai
import pytest

from superfluid.runtime.registry import EMBEDDING_ID, embedded_embedding_model, embedded_model

from .conftest import MODEL
from .daemon import Daemon
from .embed_models import build_cross_encoder

pytest.importorskip("transformers")  # the embedding model and the cross-encoder need superfluid[hf]

FIXTURE = Path(__file__).parent.parent / "fixtures" / "minilm_reference.json"
XENC = "tiny-cross-encoder"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    minilm = embedded_embedding_model().path
    xenc = build_cross_encoder(tmp_path_factory.mktemp("x") / XENC, minilm)
    d = Daemon(embedded_model().path, "--embedding-model", "default", "--model", xenc)
    d.minilm, d.xenc = minilm, xenc
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(daemon):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="x", max_retries=0, timeout=120)


def post(daemon, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(daemon.url + path, json=body, timeout=120, **kw)


def cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


TEXTS = ["The capital of France is Paris.", "def add(a, b):\n    return a + b", "Hello", "Ünïcödé — 日本語"]


def test_the_openai_client_gets_base64_and_float_alike(client):
    got = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64
    assert [d.index for d in got.data] == [0, 1, 2, 3] and got.model == MODEL
    assert all(len(d.embedding) == 576 for d in got.data)
    assert got.usage.prompt_tokens == got.usage.total_tokens > len(TEXTS)
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    for a, b in zip(got.data, floats.data, strict=True):
        assert np.array_equal(np.float32(a.embedding), np.float32(b.embedding))
        assert abs(np.linalg.norm(b.embedding) - 1) < 1e-5


def test_base64_is_little_endian_float32(daemon):
    r = post(daemon, "/v1/embeddings", {"model": MODEL, "input": "Hello", "encoding_format": "base64"}).json()
    f = post(daemon, "/v1/embeddings", {"model": MODEL, "input": "Hello"}).json()
    raw = base64.b64decode(r["data"][0]["embedding"])
    assert len(raw) == 576 * 4
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), np.float32(f["data"][0]["embedding"]))


def test_gguf_embeddings_equal_llama_cpp_reference(client, monkeypatch):
    import llama_cpp
    from llama_cpp import LLAMA_POOLING_TYPE_MEAN, Llama

    from superfluid.runtime.llamacpp_params import extra_buffers_safe

    orig = llama_cpp.llama_cpp.llama_model_default_params

    def params():  # the AMX buffers crash here (see extra_buffers_safe); same kernels otherwise
        p = orig()
        p.use_extra_bufts = extra_buffers_safe()
        return p

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", params)
    ref = Llama(embedded_model().path, embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN, n_ctx=1024,
                n_threads=1, verbose=False)
    got = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    for t, d in zip(TEXTS, got.data, strict=True):
        assert cos(ref.embed(t, normalize=True), d.embedding) >= 0.9999, t


def test_minilm_equals_sentence_transformers_and_is_the_default_embedding_model(daemon, client):
    fx = json.loads(FIXTURE.read_text())
    got = client.embeddings.create(model=EMBEDDING_ID, input=fx["texts"], encoding_format="float")
    assert got.model == EMBEDDING_ID
    for text, want, d in zip(fx["texts"], fx["vectors"], got.data, strict=True):
        assert len(d.embedding) == 384
        assert cos(want, d.embedding) >= 0.9999, text
    # a request that names no model goes to --embedding-model
    r = post(daemon, "/v1/embeddings", {"input": fx["texts"][0]}).json()
    assert r["model"] == EMBEDDING_ID and cos(r["data"][0]["embedding"], fx["vectors"][0]) >= 0.9999


def minilm_ids(daemon, text: str) -> list[int]:
    """The ids the daemon embeds for a text: [CLS] ... [SEP], as the model's tokenizer.json says."""
    from superfluid.codec.hf_tokenizer import HfTokenizer

    return HfTokenizer(daemon.minilm).encode(text, add_special=True)


def test_token_ids_embed_like_the_text(daemon, client):
    ids = minilm_ids(daemon, "Hello world")
    a = client.embeddings.create(model=EMBEDDING_ID, input="Hello world", encoding_format="float").data[0]
    b = client.embeddings.create(model=EMBEDDING_ID, input=[ids], encoding_format="float").data[0]
    c = client.embeddings.create(model=EMBEDDING_ID, input=ids, encoding_format="float").data[0]
    assert np.array_equal(a.embedding, b.embedding) and np.array_equal(a.embedding, c.embedding)


def test_over_long_inputs_are_a_typed_400_unless_truncation_is_asked(daemon, client):
    long = "word " * 400  # MiniLM's window is 256 tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBEDDING_ID, input=[long, "short"])
    assert e.value.code == "context_length_exceeded" and "256" in e.value.message
    r = post(daemon, "/v1/embeddings", {"model": EMBEDDING_ID, "input": long, "truncate": True}).json()
    assert r["usage"]["prompt_tokens"] == 256
    ids = minilm_ids(daemon, long)
    cut = ids[:255] + ids[-1:]  # the window, with its closing [SEP] kept
    want = post(daemon, "/v1/embeddings", {"model": EMBEDDING_ID, "input": cut}).json()["data"][0]["embedding"]
    assert np.allclose(r["data"][0]["embedding"], want, atol=1e-6)
    # vLLM's form
    r2 = post(daemon, "/v1/embeddings", {"model": EMBEDDING_ID, "input": long, "truncate_prompt_tokens": 100}).json()
    assert r2["usage"]["prompt_tokens"] == 100
    # Ollama truncates by default, and refuses with truncate: false
    oc = ollama.Client(host=daemon.url)
    assert len(oc.embed(model=EMBEDDING_ID, input=long).embeddings[0]) == 384
    with pytest.raises(ollama.ResponseError) as oe:
        oc.embed(model=EMBEDDING_ID, input=long, truncate=False)
    assert oe.value.status_code == 400 and "256" in oe.value.error


def test_dimensions_are_refused_for_a_model_not_trained_for_them(daemon):
    r = post(daemon, "/v1/embeddings", {"model": EMBEDDING_ID, "input": "hi", "dimensions": 64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    full = post(daemon, "/v1/embeddings", {"model": EMBEDDING_ID, "input": "hi", "dimensions": 384})
    assert full.status_code == 200 and len(full.json()["data"][0]["embedding"]) == 384


def test_bad_inputs_get_typed_errors(daemon):
    for body, param in [({"input": []}, "input"), ({"input": [[]]}, "input"), ({"input": [10 ** 9]}, "input"),
                        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
                        ({"input": ["a"] * 2049}, "input"), ({"input": {"a": 1}}, "input")]:
        r = post(daemon, "/v1/embeddings", {"model": EMBEDDING_ID, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    r = post(daemon, "/v1/embeddings", {"model": "nope", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_ollama_embed_and_the_older_embeddings(daemon, client):
    oc = ollama.Client(host=daemon.url)
    want = client.embeddings.create(model=EMBEDDING_ID, input=["a cat", "a dog"], encoding_format="float")
    got = oc.embed(model=EMBEDDING_ID, input=["a cat", "a dog"])
    assert got.model == EMBEDDING_ID and got.prompt_eval_count == want.usage.prompt_tokens
    for g, w in zip(got.embeddings, want.data, strict=True):
        assert np.allclose(g, w.embedding, atol=1e-6)
    old = oc.embeddings(model=EMBEDDING_ID, prompt="a cat")
    assert np.allclose(old.embedding, want.data[0].embedding, atol=1e-6)


def test_rerank_by_cosine_orders_the_documents(daemon):
    docs = ["Bananas are rich in potassium.", "Paris is the capital and largest city of France.",
            {"text": "The Eiffel Tower is in Paris."}, "Python is a programming language."]
    r = post(daemon, "/v1/rerank", {"query": "What is the capital of France?", "documents": docs, "top_n": 3}).json()
    assert r["model"] == EMBEDDING_ID and r["scoring"] == "cosine"
    assert [x["index"] for x in r["results"]][:2] == [1, 2] and len(r["results"]) == 3
    scores = [x["relevance_score"] for x in r["results"]]
    assert scores == sorted(scores, reverse=True)
    assert r["results"][0]["document"]["text"] == docs[1]
    q = post(daemon, "/v1/embeddings", {"input": ["What is the capital of France?", docs[1]]}).json()["data"]
    assert abs(scores[0] - cos(q[0]["embedding"], q[1]["embedding"])) < 1e-5


def test_rerank_with_a_cross_encoder_scores_pairs_with_its_head(daemon):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    docs = ["Cats are carnivores and eat meat.", "The stock market fell today.", "fish"]
    r = post(daemon, "/v1/rerank", {"model": XENC, "query": "what do cats eat?", "documents": docs,
                                    "return_documents": False}).json()
    assert r["scoring"] == "cross-encoder" and "document" not in r["results"][0]
    model = BertForSequenceClassification.from_pretrained(daemon.xenc).eval()
    tok = AutoTokenizer.from_pretrained(daemon.minilm)
    for x in r["results"]:
        enc = tok("what do cats eat?", docs[x["index"]], return_tensors="pt")
        with torch.no_grad():
            logit = float(model(**enc).logits[0, 0])
        assert abs(x["relevance_score"] - 1 / (1 + np.exp(-logit))) < 1e-5
    # a cross-encoder does not embed, and an embedding model does not chat
    e = post(daemon, "/v1/embeddings", {"model": XENC, "input": "x"})
    assert e.status_code == 400 and e.json()["error"]["code"] == "model_not_supported"
    c = post(daemon, "/v1/chat/completions", {"model": EMBEDDING_ID, "messages": [{"role": "user", "content": "hi"}]})
    assert c.status_code == 400 and c.json()["error"]["code"] == "model_not_supported"


def metric(daemon, name: str, model: str) -> float:
    for line in httpx.get(daemon.url + "/metrics").text.splitlines():
        if line.startswith(name) and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_chat_is_answered_while_an_embedding_job_runs_on_its_model(daemon, client):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 8,
            "temperature": 0}
    alone = client.chat.completions.create(**chat).choices[0].message.content
    sessions = httpx.get(daemon.url + "/v1/sessions", params={"limit": 1000}).json()
    before = metric(daemon, "superfluid_embed_tokens_total", MODEL)
    # ~60 tokens each: the job spans many steps, and the interactive chat is sent once it has begun
    chunks = [f"Chunk {i}: " + "the index holds many documents about many things " * 6 for i in range(16)]
    done: dict = {}

    def index():
        done["r"] = client.embeddings.create(model=MODEL, input=chunks, encoding_format="float")
        done["t"] = time.monotonic()

    th = threading.Thread(target=index)
    th.start()
    deadline = time.monotonic() + 60
    while metric(daemon, "superfluid_embed_tokens_total", MODEL) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    r = client.chat.completions.with_raw_response.create(**chat, extra_headers={"x-superfluid-qos": "interactive"})
    t_chat = time.monotonic()
    th.join(120)
    assert r.parse().choices[0].message.content == alone  # the same tokens as on an idle model
    assert "t" in done and t_chat < done["t"], "the chat waited for the whole embedding job"
    assert len(done["r"].data) == 16
    assert metric(daemon, "superfluid_embed_tokens_total", MODEL) - before == done["r"].usage.prompt_tokens
    # embeddings are not sessions: the log gained only the chat
    after = httpx.get(daemon.url + "/v1/sessions", params={"limit": 1000}).json()
    assert len(after["data"]) == len(sessions["data"]) + 1


def test_ollama_keep_alive_0_unloads_the_model_once_idle_and_the_next_request_loads_it(daemon):
    oc = ollama.Client(host=daemon.url)

    def loaded() -> bool:
        return httpx.get(daemon.url + f"/v1/models/{EMBEDDING_ID}").json()["meta"]["loaded"]

    assert loaded()
    oc.embed(model=EMBEDDING_ID, input="x", keep_alive=0)
    deadline = time.monotonic() + 30
    while loaded() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not loaded()
    assert len(oc.embed(model=EMBEDDING_ID, input="x").embeddings[0]) == 384 and loaded()
    oc.embed(model=MODEL, input="x", keep_alive=0)  # the default model is never unloaded
    assert httpx.get(daemon.url + f"/v1/models/{MODEL}").json()["meta"]["loaded"]
