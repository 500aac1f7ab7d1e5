"""Serving a Hugging Face folder (config.json + safetensors + tokenizer.json): the daemon
tokenizes with the folder's tokenizer.json (the same ids and bytes as the GGUF it came from),
the transformers runtime is picked for it, and greedy chat equals `model.generate`."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from . import hf  # noqa: E402
from .daemon import Daemon  # noqa: E402

N = 16


@pytest.fixture(scope="module")
def served():
    folder = hf.full_folder()
    d = Daemon(folder, "--sessions-cache", max_context=512, max_batch=4)
    yield d
    d.stop()


def test_the_folders_tokenizer_matches_the_gguf():
    from superfluid.codec.hf_tokenizer import HfTokenizer
    from superfluid.codec.tokenizer import Tokenizer

    h, g = HfTokenizer(hf.full_folder()), Tokenizer(hf.gguf())
    assert h.n_vocab == g.n_vocab and h.pieces == g.pieces  # every token's bytes
    text = "Hello, wörld! <|im_start|>user\n日本語  spaces\n\ttabs 123456 émoji 🙂"
    assert h.encode(text) == g.encode(text)  # special tokens in user text stay text
    assert h.encode(text, parse_special=True) == g.encode(text, parse_special=True)
    assert h.encode(text) != h.encode(text, parse_special=True)
    assert h.chat_template == g.chat_template and h.bos == g.bos and h.eos == g.eos
    assert h.shape.n_layer == 30 and h.shape.n_head_kv == 3 and h.shape.n_ctx_train == 8192


def test_a_folder_is_served_on_transformers_and_answers_like_generate(served):
    from superfluid.codec.tokenizer import Tokenizer

    q = "What is the capital of France?"
    oc = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=120)
    (model,) = [m.id for m in oc.models.list().data]
    assert model == "SmolLM2-135M-Instruct-hf"
    r = oc.chat.completions.create(model=model, messages=[{"role": "user", "content": q}], temperature=0,
                                   max_tokens=N)
    prompt = hf.chat_prompt(q)
    toks = [t for t in hf.generate(prompt, N) if t not in hf.EOG]
    assert r.usage.prompt_tokens == len(prompt)
    assert r.choices[0].message.content == Tokenizer(hf.gguf()).decode(toks)
    assert httpx.get(served.url + "/health").json()["status"] == "ok"


def test_llamacpp_refuses_a_folder_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", hf.full_folder(), "--runtime", "llamacpp",
                        "--port", "1"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SUPERFLUID_HOME": str(tmp_path)})
    assert r.returncode == 2 and "Hugging Face folder" in r.stderr and len(r.stderr.strip().splitlines()) == 1
