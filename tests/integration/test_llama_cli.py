"""`superfluid serve` with llama-server's flags (-m, -c, -np, -t, --jinja, --api-key, --alias),
and --strict-models: a model name it does not serve is a 404 even with one model."""

import os
import subprocess
import sys

import httpx
import pytest

from superfluid.runtime.registry import embedded_model

from .conftest import MODEL
from .daemon import Daemon, free_port

KEY = "sk-llama-server-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def d():
    # the Daemon helper adds --max-context 1024 --max-batch 8 --threads 1: -c, -np and -t win
    dm = Daemon("-m", embedded_model().path, "-c", "512", "-np", "2", "-t", "1", "--jinja", "--api-key", KEY,
                "--strict-models", "--alias", f"small={MODEL}")
    yield dm
    dm.stop()


def post(d, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(d.url + path, json=body, headers=AUTH if headers is None else headers, timeout=120)


def test_llama_server_flags_take_effect(d):
    assert post(d, "/completion", {"prompt": "Hi", "n_predict": 1}, headers={}).status_code == 401
    p = httpx.get(d.url + "/props", headers=AUTH).json()
    assert p["total_slots"] == 2 and p["default_generation_settings"]["n_ctx"] == 512
    assert os.path.samefile(p["model_path"], embedded_model().path)
    assert len(httpx.get(d.url + "/slots", headers=AUTH).json()) == 2


def test_strict_models_refuses_unknown_names(d):
    r = post(d, "/v1/chat/completions", {"model": "gpt-3.5-turbo", "messages": MSGS, "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = post(d, "/completion", {"model": "gpt-3.5-turbo", "prompt": "Hi", "n_predict": 1})
    assert r.status_code == 404 and r.json()["error"] == {
        "code": 404, "type": "not_found_error", "param": "model", "message": r.json()["error"]["message"]}
    for model in (None, "small", MODEL):
        body = {"messages": MSGS, "max_tokens": 2, **({"model": model} if model else {})}
        r = post(d, "/v1/chat/completions", body)
        assert r.status_code == 200 and r.json()["model"] == MODEL, (model, r.text)


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", *args, "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)


def test_contradictions_exit_2(tmp_path):
    r = serve(embedded_model().path, "-m", str(tmp_path / "other.gguf"))
    assert r.returncode == 2 and "give the model once" in r.stderr
    r = serve("--alias", "x=", "--no-tui")
    assert r.returncode == 2 and "NAME=MODEL_ID" in r.stderr
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", "--alias", "gpt-4=nope", "--no-tui",
                        "--port", str(free_port())], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "SUPERFLUID_HOME": str(tmp_path)})
    assert r.returncode == 2 and "--alias gpt-4=nope" in r.stderr.strip().splitlines()[-1]
