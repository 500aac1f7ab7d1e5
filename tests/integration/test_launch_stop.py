"""What `superfluid launch` hands each agent (its environment and arguments, recorded by a
stand-in on PATH: the real agents run in test_agents.py), `superfluid stop`, and draining
with SIGUSR1."""

import json
import os
import stat
import subprocess
import sys
import threading

import httpx

from .conftest import MODEL
from .daemon import Daemon, free_port

STAND_IN = """#!{python}
import json, os, sys
keys = [k for k in os.environ if k.startswith(("ANTHROPIC_", "CLAUDE_", "OLLAMA_", "OPENCODE_", "SUPERFLUID_API",
                                               "PI_", "HERMES_", "CLINE_"))]
with open(os.environ["RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": {{k: os.environ[k] for k in keys}}}}, f)
"""


def stand_ins(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("claude", "codex", "opencode", "pi", "cline", "hermes", "ollama"):
        p = bin_dir / name
        p.write_text(STAND_IN.format(python=sys.executable))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def cli(*args, home, path, record=None, timeout=120):
    env = {**os.environ, "SUPERFLUID_HOME": str(home), "PATH": f"{path}:{os.environ['PATH']}"}
    if record:
        env["RECORD"] = str(record)
    return subprocess.run([sys.executable, "-m", "superfluid.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_launch_each_agent_against_a_running_server(tmp_path):
    bin_dir = stand_ins(tmp_path)
    d = Daemon(max_batch=1, max_context=256)
    try:
        rec = tmp_path / "rec.json"
        port = str(d.port)
        os.environ["ANTHROPIC_API_KEY"] = "sk-ant-inherited"
        try:
            r = cli("launch", "claude", "--port", port, "--", "--print", "hi", home=d.home, path=bin_dir, record=rec)
        finally:
            del os.environ["ANTHROPIC_API_KEY"]
        assert r.returncode == 0, r.stderr
        assert "needs a window of about 32768 tokens" in r.stderr  # the daemon serves 256
        got = json.loads(rec.read_text())
        assert got["argv"] == ["--print", "hi"]
        env = got["env"]
        assert env["ANTHROPIC_BASE_URL"] == d.url and env["ANTHROPIC_MODEL"] == MODEL
        assert env["ANTHROPIC_DEFAULT_OPUS_MODEL"] == env["CLAUDE_CODE_SUBAGENT_MODEL"] == MODEL
        assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "256" and env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
        assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "256"  # output_limit's floor
        assert "ANTHROPIC_API_KEY" not in env
        assert int(env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"]) >= 1_800_000  # a long cold prefill is not cut and retried

        cli("launch", "pi", "--port", port, "--", "-p", "hi", home=d.home, path=bin_dir, record=rec)
        got = json.loads(rec.read_text())
        assert got["argv"] == ["--provider", "superfluid", "--model", MODEL, "-p", "hi"]
        models = json.loads(open(os.path.join(got["env"]["PI_CODING_AGENT_DIR"], "models.json")).read())
        assert models["providers"]["superfluid"]["baseUrl"] == d.url + "/v1"

        cli("launch", "codex", "--port", port, "--", "exec", "task", home=d.home, path=bin_dir, record=rec)
        got = json.loads(rec.read_text())
        assert "model_provider=superfluid" in got["argv"] and got["argv"][-2:] == ["exec", "task"]
        assert any(f'base_url="{d.url}/v1"' in a and 'wire_api="responses"' in a for a in got["argv"])

        cli("launch", "opencode", "--port", port, home=d.home, path=bin_dir, record=rec)
        cfg_path = json.loads(rec.read_text())["env"]["OPENCODE_CONFIG"]
        assert cfg_path.startswith(d.home)
        cfg = json.loads(open(cfg_path).read())
        assert cfg["provider"]["superfluid"]["options"]["baseURL"] == d.url + "/v1"

        cli("launch", "cline", "--port", port, "--", "hi", home=d.home, path=bin_dir, record=rec)
        got = json.loads(rec.read_text())
        assert got["argv"] == ["hi"]
        cfg = json.loads(open(got["env"]["CLINE_PROVIDER_SETTINGS_PATH"]).read())
        assert cfg["lastUsedProvider"] == "openai-compatible" and "updatedAt" in cfg["providers"]["openai-compatible"]
        settings = cfg["providers"]["openai-compatible"]["settings"]
        assert settings["baseUrl"] == d.url + "/v1" and settings["model"] == MODEL
        assert settings["contextWindow"] == 256

        r = cli("launch", "hermes", "--port", port, "--", "-z", "hi", home=d.home, path=bin_dir, record=rec)
        assert "needs a window of about 64000 tokens" in r.stderr
        got = json.loads(rec.read_text())
        assert got["argv"] == ["-z", "hi"] and got["env"]["HERMES_DISABLE_LAZY_INSTALLS"] == "1"
        cfg = json.loads(open(os.path.join(got["env"]["HERMES_HOME"], "config.yaml")).read())  # JSON is YAML
        assert cfg["model"]["base_url"] == d.url + "/v1" and cfg["model"]["default"] == MODEL
        assert cfg["model"]["context_length"] == 64000  # Hermes's floor: it refuses less (launch warned)

        cli("launch", "ollama", "--port", port, "--", "list", home=d.home, path=bin_dir, record=rec)
        got = json.loads(rec.read_text())
        assert got["env"]["OLLAMA_HOST"] == d.url and got["argv"] == ["list"]

        r = cli("sessions", "prune", "--port", port, "--older-than", "0", home=d.home, path=bin_dir)
        assert r.returncode == 0 and r.stdout.startswith("erased "), r.stderr  # the admin route, keyless

        listing = cli("launch", home=d.home, path=bin_dir).stdout
        assert f"installed at {bin_dir}/claude" in listing
        assert cli("launch", "vim", home=d.home, path=bin_dir).returncode == 2
    finally:
        d.stop()


def test_launch_starts_a_server_when_none_answers_and_stop_stops_it(tmp_path):
    bin_dir = stand_ins(tmp_path)
    home = tmp_path / "home"
    port = str(free_port())
    rec = tmp_path / "rec.json"
    r = cli("launch", "ollama", "--port", port, "--", "ps", home=home, path=bin_dir, record=rec, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "starting `superfluid serve`" in r.stderr
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    assert (home / "run" / f"serve-{port}.pid").exists()
    assert cli("stop", "--port", port, home=home, path=bin_dir).returncode == 0
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
        raise AssertionError("still serving")
    except httpx.HTTPError:
        pass
    assert not (home / "run" / f"serve-{port}.pid").exists()
    assert cli("stop", "--port", port, home=home, path=bin_dir).returncode == 1


def test_drain_lets_running_streams_finish(tmp_path):
    d = Daemon(max_batch=1, max_context=512)
    body = {"model": MODEL, "max_tokens": 60, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "Tell a story."}]}
    out = {}

    def stream():
        finish = None
        with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ch = json.loads(line[6:])["choices"]
                    if ch:
                        finish = ch[0]["finish_reason"] or finish
                if line == "data: [DONE]":
                    out["done"] = True
        out["finish"] = finish

    t = threading.Thread(target=stream)
    t.start()
    import time
    deadline = time.monotonic() + 30
    while next(iter(d.health()["models"].values()))["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    r = cli("stop", "--port", str(d.port), "--drain", "--timeout", "120", home=d.home, path="")
    t.join(120)
    assert r.returncode == 0, r.stderr
    assert out == {"done": True, "finish": "length"}  # the running stream was not cut
    assert d.proc.wait(30) == 0
