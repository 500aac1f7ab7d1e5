"""Embeddings through a fleet head: batches go to the nodes that serve the model, spread by
load, and a batch whose node is lost is sent to another node (embedding is idempotent)."""

import os
import signal
import threading
import time

import numpy as np
import openai
import pytest

from superfluid.codec.tokenizer import Tokenizer
from superfluid.plan import EmbedItem, StepPlan
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.registry import embedded_model

from .conftest import MODEL
from .daemon import Daemon
from .fleet import Node, together


@pytest.fixture(scope="module")
def fleet():
    a, b = together(Node, Node)
    head = Daemon("--fleet", f"127.0.0.1:{a.port},127.0.0.1:{b.port}", "--fleet-timeout", "2", "--no-ui")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(n["up"] for n in head.health()["models"][MODEL]["nodes"]):
        time.sleep(0.2)
    yield head, a, b
    head.stop()
    for n in (a, b):
        if n.proc.poll() is None:
            os.kill(n.proc.pid, signal.SIGCONT)
        n.stop()


def client(d) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=300)


def reference(texts: list[str]) -> list[np.ndarray]:
    """The same model embedded in this process by the same runtime code, one input at a time."""
    path = embedded_model().path
    tok = Tokenizer(path)
    rt = LlamaCppRuntime(path, lanes=1, n_ctx=1024, threads=1, batch_tokens=64)
    try:
        return [np.frombuffer(rt.step(StepPlan(i, embeds=(EmbedItem(0, tuple(tok.encode(t, add_special=True))),)))
                              .vectors[0].data, dtype="<f4") for i, t in enumerate(texts)]
    finally:
        rt.close()


def cos(a, b) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


def test_embeddings_through_the_head_equal_the_model_s(fleet):
    head, _, _ = fleet
    texts = ["The capital of France is Paris.", "def add(a, b): return a + b", "Hello"]
    got = client(head).embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in got.data] == [0, 1, 2] and got.usage.prompt_tokens > 3
    for want, d in zip(reference(texts), got.data, strict=True):
        assert cos(want, d.embedding) >= 0.99999


def test_a_lost_node_s_batches_go_to_the_other_node(fleet):
    head, a, b = fleet
    # five batches of at most 64, spread over both nodes: A takes two (each input is ~4 tokens
    # of prefill on one thread, so the count is most of this test's time)
    texts = [f"item {i}" for i in range(260)]
    os.kill(a.proc.pid, signal.SIGSTOP)  # A takes batches and never answers
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(r=client(head).embeddings.create(
        model=MODEL, input=texts, encoding_format="float")))
    th.start()
    th.join(120)
    assert "r" in out, "the request did not finish after its node was lost"
    r = out["r"]
    assert len(r.data) == 260 and [d.index for d in r.data] == list(range(260))
    for want, i in zip(reference([texts[0], texts[130], texts[259]]), (0, 130, 259), strict=True):
        assert cos(want, r.data[i].embedding) >= 0.99999
    a.kill()
    head.stop()
    log = head.proc.stdout.read()
    assert "was lost; sending it to another node" in log  # A had work, and it moved to B
