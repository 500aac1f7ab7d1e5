"""A head that also serves its model as a node (--fleet-local), two node processes of
different sizes and models, and several models on one fleet: each request lands on a node
that serves its model and fits its prompt, and work moves to the head when its node dies."""

import os
import signal
import threading
import time

import openai
import pytest

from superfluid.runtime.registry import embedded_model

from .conftest import MODEL
from .daemon import Daemon
from .fleet import Node, together

OTHER = "Other-135M"
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    other = tmp_path_factory.mktemp("models") / f"{OTHER}.gguf"
    os.symlink(embedded_model().path, other)  # the same weights under another model name
    a, b = together(lambda: Node(max_context=2048),  # bigger than the head's own window (1024)
                    lambda: Node(str(other)))
    head = Daemon(embedded_model().path, "--fleet", f"127.0.0.1:{a.port},127.0.0.1:{b.port}", "--fleet-local",
                  "--model", str(other), "--resume-grace", "0")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(n["up"] for n in nodes(head)):
        time.sleep(0.2)
    yield head, a, b
    head.stop()
    a.stop()
    b.stop()


def oc(d):
    return openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=120)


def nodes(head, model: str = MODEL) -> list[dict]:
    return head.health()["models"][model]["nodes"]


def placed(head, model: str = MODEL) -> dict[str, int]:
    """Generations placed per node (by address; the head's own node as 'local')."""
    return {("local" if n["name"] == "head (local)" else n["addr"]): n["placed"]
            for n in nodes(head, model) if n["placed"]}


def test_the_head_is_one_of_the_nodes(fleet):
    head, a, b = fleet
    by_name = {n["name"]: n for n in nodes(head)}
    assert by_name["head (local)"]["up"] and by_name["head (local)"]["models"] == [MODEL]
    assert sorted(m.id for m in oc(head).models.list().data) == sorted([MODEL, OTHER])


def _stream(head, model, messages, max_tokens, out: list, started: threading.Event | None = None):
    text = ""
    for ch in oc(head).chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                               temperature=0, stream=True):
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
            if started is not None:
                started.set()
    out.append(text)


def _while_streaming(head, model, messages, max_tokens=60) -> tuple[dict, str]:
    out: list[str] = []
    started = threading.Event()
    t = threading.Thread(target=_stream, args=(head, model, messages, max_tokens, out, started))
    t.start()
    assert started.wait(60)
    where = placed(head, model)
    t.join(120)
    return where, out[0]


def test_each_model_runs_on_the_nodes_that_serve_it(fleet, client):
    head, a, b = fleet
    where, text = _while_streaming(head, OTHER, STORY)
    assert where == {f"127.0.0.1:{b.port}": 1}  # only node B serves it
    want = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=60, temperature=0)
    assert text == want.choices[0].message.content  # same weights, another name, the same tokens
    where, _ = _while_streaming(head, MODEL, STORY, 20)
    assert len(where) == 1 and f"127.0.0.1:{b.port}" not in where  # the default model never lands on B


def test_a_prompt_only_the_bigger_node_fits_goes_there(fleet):
    head = fleet[0]
    long = [{"role": "user", "content": "Summarize: " + "the keeper trimmed the lamp at dusk. " * 130}]
    where, text = _while_streaming(head, MODEL, long, 8)
    assert where == {f"127.0.0.1:{fleet[1].port}": 1} and text
    with pytest.raises(openai.BadRequestError) as e:  # fits no node at all
        oc(head).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x " * 2100}],
                                         max_tokens=8)
    assert "2048" in str(e.value)


def test_work_moves_to_the_head_when_its_node_dies(fleet, client):
    head, a, _ = fleet
    want = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=60, temperature=0)
    out: list[str] = []
    threads = []
    for _ in range(2):  # load-aware: the first lands on the head, the second on node A
        started = threading.Event()
        t = threading.Thread(target=_stream, args=(head, MODEL, STORY, 60, out, started))
        t.start()
        threads.append(t)
        assert started.wait(60)
    assert placed(head) == {"local": 1, f"127.0.0.1:{a.port}": 1}
    a.proc.send_signal(signal.SIGKILL)
    for t in threads:
        t.join(120)
    assert out == [want.choices[0].message.content] * 2  # one continuous stream each, no token twice
    assert placed(head) == {}
    assert oc(head).chat.completions.create(model=MODEL, messages=STORY, max_tokens=5).choices[0].message.content
