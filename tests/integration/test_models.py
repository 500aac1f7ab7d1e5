"""Several models: a directory of GGUFs loaded on demand, load/unload/delete under traffic.
(Idle unloading, on the daemon's clock: tests/app/test_models.py.)"""

import json
import os
import threading

import httpx
import pytest

from superfluid.runtime.registry import embedded_model

from .conftest import MODEL
from .daemon import Daemon


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    for name in ("alpha", "beta"):
        os.symlink(embedded_model().path, models / f"{name}.gguf")
    daemon = Daemon("--model-dir", str(models), "--idle-timeout", "3", max_batch=1, max_context=512)
    yield daemon
    daemon.stop()


def cards(d) -> dict:
    return {m["id"]: m["meta"] for m in httpx.get(d.url + "/v1/models").json()["data"]}


def chat(d, model, **kw):
    return httpx.post(d.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}], **kw})


def test_directory_models_load_on_their_first_request(d):
    c = cards(d)
    assert set(c) == {MODEL, "alpha", "beta"}
    assert c[MODEL]["loaded"] and c[MODEL]["default"]
    assert not c["alpha"]["loaded"]
    r = chat(d, "alpha")
    assert r.status_code == 200 and r.json()["model"] == "alpha"
    assert cards(d)["alpha"]["loaded"]


def test_unload_under_traffic_then_reload_on_next_request(d):
    assert chat(d, "beta").status_code == 200
    out: dict = {"lines": []}
    generating = threading.Event()  # the stream has sent a token: the generation is running

    def stream():
        body = {"model": "beta", "max_tokens": 300, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "Write a long story."}]}
        try:
            with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=120) as r:
                for ln in r.iter_lines():
                    if ln.startswith("data: "):
                        out["lines"].append(ln)
                        if len(out["lines"]) >= 2:  # the role chunk, then the first token
                            generating.set()
        except Exception as e:  # reported below
            out["error"] = repr(e)
        finally:
            generating.set()

    t = threading.Thread(target=stream)
    t.start()
    assert generating.wait(60)
    r = httpx.post(d.url + "/v1/models/unload", json={"model": "beta"}, timeout=60)
    assert r.status_code == 200 and r.json()["meta"]["loaded"] is False
    t.join(60)
    assert "error" not in out, out["error"]
    lines = out["lines"]
    assert lines[-1] == "data: [DONE]"
    errors = [json.loads(ln[6:])["error"] for ln in lines if ln.startswith('data: {"error"')]
    assert errors and errors[0]["code"] == "model_unloaded"
    assert chat(d, "beta").status_code == 200  # loaded again
    assert cards(d)["beta"]["loaded"]


def test_load_with_reload_starts_a_loaded_models_worker_afresh(d):
    def pid() -> int:
        return httpx.get(d.url + "/health", timeout=10).json()["models"][MODEL]["worker_pid"]
    before = pid()
    r = httpx.post(d.url + "/v1/models/load", json={"model": MODEL}, timeout=120)
    assert r.status_code == 200 and pid() == before  # loaded already: nothing happens
    r = httpx.post(d.url + "/v1/models/load", json={"model": MODEL.lower(), "reload": True}, timeout=120)
    assert r.status_code == 200 and r.json()["id"] == MODEL
    assert pid() != before and chat(d, MODEL).status_code == 200


def test_a_path_is_no_model_without_allow_model_paths(d, tmp_path):
    """Only --model and --model-dir models load by default; a path (a real model, a file that
    is not one, nothing at all) gets the answer an unknown id gets, so nothing of the disk
    shows. (Loading by path, with an admin key and --allow-model-paths: test_auth.py.)"""
    path = tmp_path / "gamma.gguf"
    os.symlink(embedded_model().path, path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    answers = []
    for model in (str(path), str(bad), str(tmp_path / "none.gguf"), "nope"):
        r = httpx.post(d.url + "/v1/models/load", json={"model": model}, timeout=60)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", (model, r.text)
        answers.append(r.json()["error"]["message"].replace(model, "X"))
    assert len(set(answers)) == 1
    assert chat(d, "gamma").status_code == 404
    assert httpx.delete(d.url + f"/v1/models/{MODEL}").status_code == 400
