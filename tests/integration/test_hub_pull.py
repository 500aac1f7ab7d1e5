"""Models by name (issue 34): `superfluid pull`, `serve NAME`, `--offline`, `models`, `rm` and
POST /v1/models/load, against a loopback mirror of the hub's file API (HF_ENDPOINT) that
serves the embedded packages' real files: the SmolLM2 GGUF whole and split in two, and the
MiniLM sentence-transformers folder."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from superfluid.runtime.registry import embedded_embedding_model, embedded_model

from . import hf
from ..scratch import scratch
from .daemon import Daemon, free_port
from .hub_mirror import Mirror, split_gguf

GGUF = Path(embedded_model().path)  # SmolLM2-135M-Instruct.Q4_1.gguf
WHOLE, SPLIT, FOLDER, BAD = "test/SmolLM2-GGUF", "test/SmolLM2-split-GGUF", "test/MiniLM", "test/Corrupt-GGUF"
AGAIN = "test/SmolLM2-again-GGUF"  # pulled through Ollama's /api/pull only
LLM = "test/SmolLM2-HF"  # a safetensors repo


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def mirror():
    m = Mirror()
    parts_dir = Path(scratch("sf-split-"))
    parts = split_gguf(GGUF, parts_dir, GGUF.stem)
    m.add(WHOLE, {GGUF.name: GGUF, f"mmproj-{GGUF.stem}.gguf": GGUF})  # a projector is never the model
    m.add(SPLIT, {p.name: p for p in parts})
    m.add(BAD, {GGUF.name: GGUF})
    m.add(AGAIN, {GGUF.name: GGUF})
    folder = Path(embedded_embedding_model().path)
    m.add(FOLDER, {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()})
    m.url = m.start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def hf_home():
    return scratch("sf-hf-home-")


def env_of(mirror, hf_home: str, **more: str) -> dict[str, str]:
    return {"HF_ENDPOINT": mirror.url, "HF_HOME": hf_home, "HF_HUB_DISABLE_TELEMETRY": "1", **more}


def superfluid(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "superfluid.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def test_a_pull_resumes_after_a_dropped_connection_shows_progress_and_checks_the_file(mirror, hf_home):
    half = GGUF.stat().st_size // 2
    mirror.drop_after[f"{WHOLE}/{GGUF.name}"] = half
    before = len(mirror.requests)
    r = superfluid("pull", f"{WHOLE}:Q4_1", env=env_of(mirror, hf_home))
    assert r.returncode == 0, r.stderr
    path = r.stdout.split(": ", 1)[1].rsplit(" (", 1)[0]
    assert Path(path).name == GGUF.name and sha256(path) == sha256(GGUF)
    # the second GET asked for the rest only, and no byte was fetched twice over
    gets = [(p, rng) for m, p, rng in mirror.requests[before:] if m == "GET" and p.endswith(GGUF.name)]
    assert len(gets) == 2 and gets[0][1] == "" and gets[1][1].startswith("bytes="), gets
    assert 0 < int(gets[1][1][6:-1]) <= half
    assert mirror.sent[f"{WHOLE}/{GGUF.name}"] < GGUF.stat().st_size * 1.5
    # progress off a terminal: log lines, at least one partway
    assert f"pulling {GGUF.name} (98.4 MB)" in r.stderr and "% of 98.4 MB" in r.stderr, r.stderr
    assert "mmproj" not in r.stderr


def test_a_file_that_fails_its_sha256_is_refused_and_removed(mirror, hf_home):
    mirror.corrupt.add(f"{BAD}/{GGUF.name}")
    env = env_of(mirror, hf_home)
    r = superfluid("pull", BAD, env=env)
    assert r.returncode == 1
    assert f"{BAD}/{GGUF.name} failed its sha256 check" in r.stderr and "the file was removed" in r.stderr, r.stderr
    assert BAD not in superfluid("models", env=env).stdout  # nothing of it is left to serve
    mirror.corrupt.clear()
    assert superfluid("pull", BAD, env=env).returncode == 0  # pulled again, right this time


def test_two_pulls_of_one_split_model_at_once_both_get_it_whole(mirror, hf_home):
    env = env_of(mirror, hf_home)
    results: list[subprocess.CompletedProcess] = []
    threads = [threading.Thread(target=lambda: results.append(superfluid("pull", f"{SPLIT}:Q4_1", env=env)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-800:] for r in results]
    first = Path(results[0].stdout.split(": ", 1)[1].rsplit(" (", 1)[0])
    assert first.name.endswith("-00001-of-00002.gguf")
    assert {r.stdout for r in results} == {results[0].stdout}
    for p in sorted(first.parent.glob("*-of-00002.gguf")):
        assert sha256(p) == mirror.repos[SPLIT][p.name].sha256


def test_serve_by_name_with_a_folder_model_then_load_by_name_then_offline(mirror, hf_home):
    env = env_of(mirror, hf_home)
    d = Daemon(f"{SPLIT}:Q4_1", "--embedding-model", FOLDER, max_context=512, max_batch=2, env=env)
    try:
        cards = {m["id"]: m for m in httpx.get(d.url + "/v1/models", timeout=10).json()["data"]}
        assert list(cards)[0] == f"{SPLIT}:Q4_1" and FOLDER in cards  # the names as given
        # each model's capability record (service/capabilities.py), from the real files
        gguf, folder = cards[f"{SPLIT}:Q4_1"], cards[FOLDER]
        assert gguf["capabilities"]["chat"] is True and gguf["capabilities"]["embeddings"] is True
        assert gguf["quantization"] == "Q4_1" and gguf["context_window"] == 512
        assert folder["capabilities"]["embeddings"] is True and "does not generate" in folder["capabilities"]["chat"]
        tags = {m["name"]: m for m in httpx.get(d.url + "/api/tags", timeout=10).json()["models"]}
        assert tags[f"{SPLIT}:Q4_1"]["details"]["quantization_level"] == "Q4_1"
        assert tags[f"{SPLIT}:Q4_1"]["details"]["family"] == "llama"
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="x")
        chat = client.chat.completions.create(model=f"{SPLIT}:Q4_1", max_tokens=8, temperature=0,
                                              messages=[{"role": "user", "content": "Say hi."}])
        assert chat.choices[0].message.content and chat.model == f"{SPLIT}:Q4_1"
        emb = client.embeddings.create(model=FOLDER, input="hello", encoding_format="float")
        assert len(emb.data[0].embedding) == 384
        # an admin's load by name pulls (off the event loop) and serves under that name
        r = httpx.post(d.url + "/v1/models/load", json={"model": f"{WHOLE}:Q4_1"}, timeout=120)
        assert r.status_code == 200 and r.json()["id"] == f"{WHOLE}:Q4_1", r.text
        r = httpx.post(d.url + "/v1/models/load", json={"model": "test/Not-There-GGUF"}, timeout=60)
        assert r.status_code == 400 and "is not on" in r.json()["error"]["message"], r.text
        # Ollama's /api/pull, through the official client: progress, then the model is served
        oc = ollama.Client(host=d.url)
        events = list(oc.pull(f"{AGAIN}:Q4_1", stream=True))
        assert events[0].status == "pulling manifest" and events[-1].status == "success"
        partway = [e for e in events if e.status == f"pulling {GGUF.name}" and 0 < (e.completed or 0) < (e.total or 0)]
        assert partway and partway[-1].total == GGUF.stat().st_size
        assert f"{AGAIN}:Q4_1" in [m.model for m in oc.list().models]
        assert oc.chat(model=f"{AGAIN}:Q4_1", messages=[{"role": "user", "content": "Hi"}],
                       options={"num_predict": 3}).message.role == "assistant"
        with pytest.raises(ollama.ResponseError, match="is not on"):
            list(oc.pull("test/Not-There-GGUF", stream=True))
    finally:
        d.stop()
    # offline, the hub unreachable: what is cached serves, and what is not is one clear line
    dead = env_of(mirror, hf_home, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    d = Daemon("-hf", f"{SPLIT}:Q4_1", "--offline", max_context=512, max_batch=2, env=dead)  # llama-server's flag
    try:
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="x")
        chat = client.chat.completions.create(model=f"{SPLIT}:Q4_1", max_tokens=4, temperature=0,
                                              messages=[{"role": "user", "content": "Say hi."}])
        assert chat.choices[0].finish_reason in ("stop", "length")
    finally:
        d.stop()
    r = superfluid("pull", f"{SPLIT}:Q4_1", env=dead)  # not told it is offline: the cached copy, with a warning
    assert r.returncode == 0 and "cannot reach" in r.stderr and "serving the copy in the cache" in r.stderr
    r = superfluid("serve", "test/Never-Pulled-GGUF:Q4_K_M", "--offline", env=dead)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "superfluid: test/Never-Pulled-GGUF:Q4_K_M is not in the cache "
        f"({hf_home}/hub), and HF_HUB_OFFLINE is set: pull it first (superfluid pull test/Never-Pulled-GGUF:Q4_K_M)")


def test_models_lists_the_cache_with_sizes_and_rm_deletes(mirror):
    home = scratch("sf-hf-home-")
    env = env_of(mirror, home)
    assert superfluid("pull", f"{WHOLE}:Q4_1", env=env).returncode == 0
    assert superfluid("pull", FOLDER, env=env).returncode == 0
    listing = superfluid("models", env=env).stdout
    assert f"{WHOLE}:{GGUF.name}  " in listing and "98.4 MB" in listing and FOLDER in listing, listing
    r = superfluid("rm", f"{WHOLE}:Q4_1", env=env)
    assert r.returncode == 0 and "removed" in r.stdout
    listing = superfluid("models", env=env).stdout
    assert WHOLE not in listing and FOLDER in listing
    assert superfluid("rm", FOLDER, env=env).returncode == 0
    assert "no models pulled" in superfluid("models", env=env).stdout
    r = superfluid("rm", FOLDER, env=env)
    assert r.returncode == 1 and "not in the cache" in r.stderr


@pytest.fixture(scope="module")
def llm_repo(mirror):
    """The embedded GGUF as a Hugging Face repo: its weights as safetensors (runtime/hf_convert),
    and the tokenizer.json transformers makes from the GGUF's vocabulary."""
    from transformers import AutoTokenizer
    weights = Path(hf.folder())
    tok_dir = Path(scratch("sf-hf-tok-"))
    AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name).save_pretrained(tok_dir)
    files = {p.name: p for p in weights.iterdir() if p.is_file() and p.name != "superfluid.json"}
    files.update({p.name: p for p in tok_dir.iterdir() if p.is_file()})
    mirror.add(LLM, files)
    return LLM


def test_a_safetensors_repo_is_a_folder_for_the_transformers_runtime(mirror, hf_home, llm_repo):
    code = ("from superfluid.runtime.registry import resolve, default_runtime; s = resolve('test/SmolLM2-HF'); "
            "import os; print(s.id, default_runtime(s.path), *sorted(os.listdir(s.path)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env_of(mirror, hf_home)})
    assert r.returncode == 0, r.stderr
    name, runtime, *files = r.stdout.split()
    assert (name, runtime) == (LLM, "transformers")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert set(files) <= set(mirror.repos[LLM])
