"""`superfluid launch AGENT [-- args]`: start a coding agent pointed at this server, starting
`superfluid serve` in the background first if nothing answers. Never edits an agent's own
config files: what an agent needs goes in its environment, its command line, or a per-run
file under <home>/launch/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .config import home


@dataclass(frozen=True)
class Agent:
    name: str
    command: str
    what: str


AGENTS = {
    "claude": Agent("claude", "claude", "Claude Code, through the Anthropic Messages API"),
    "codex": Agent("codex", "codex", "OpenAI Codex CLI, through the Responses API"),
    "opencode": Agent("opencode", "opencode", "opencode, through the OpenAI chat API"),
    "ollama": Agent("ollama", "ollama", "the ollama CLI, through the Ollama API"),
}


def listing() -> str:
    lines = ["agents superfluid can launch:"]
    for a in AGENTS.values():
        where = shutil.which(a.command)
        lines.append(f"  {a.name:<9} {'installed at ' + where if where else 'not installed':<40} {a.what}")
    return "\n".join(lines)


def server_model(url: str, api_key: str | None) -> str | None:
    """The default model's id if a server answers at url, else None."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url + "/v1/models", headers=headers, timeout=2)
        if r.status_code == 200:
            return r.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        pass
    return None


def ensure_server(url: str, port: int, api_key: str | None, serve_args: list[str]) -> str:
    model = server_model(url, api_key)
    if model is not None:
        return model
    log_dir = home() / "launch"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / "serve.log", "ab")
    cmd = [sys.executable, "-m", "superfluid.cli", "serve", "--port", str(port), "--no-tui", *serve_args]
    print(f"superfluid: nothing answers at {url}; starting `superfluid serve` (log: {log_dir / 'serve.log'})",
          file=sys.stderr)
    subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        model = server_model(url, api_key)
        if model is not None:
            return model
        time.sleep(0.5)
    raise RuntimeError(f"the server did not come up at {url}; see {log_dir / 'serve.log'}")


def agent_setup(name: str, url: str, model: str, api_key: str | None) -> tuple[dict[str, str], list[str]]:
    """(environment additions, leading arguments) for one agent."""
    token = api_key or "superfluid"
    if name == "claude":
        return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": token, "ANTHROPIC_MODEL": model,
                "ANTHROPIC_SMALL_FAST_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model}, []
    if name == "codex":
        provider = (f'model_providers.superfluid={{name="superfluid", base_url="{url}/v1", '
                    f'env_key="SUPERFLUID_API_KEY", wire_api="responses"}}')
        return {"SUPERFLUID_API_KEY": token}, ["-c", provider, "-c", "model_provider=superfluid", "-m", model]
    if name == "opencode":
        path = home() / "launch" / "opencode.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"superfluid": {"npm": "@ai-sdk/openai-compatible", "name": "superfluid",
                                        "options": {"baseURL": f"{url}/v1", "apiKey": token},
                                        "models": {model: {"name": model}}}},
            "model": f"superfluid/{model}"}, indent=2))
        return {"OPENCODE_CONFIG": str(path)}, []
    if name == "ollama":
        return {"OLLAMA_HOST": url}, []
    raise KeyError(name)


def launch(name: str, args: list[str], *, port: int, api_key: str | None, serve_args: list[str]) -> int:
    agent = AGENTS.get(name)
    if agent is None:
        print(f"superfluid: unknown agent '{name}'\n{listing()}", file=sys.stderr)
        return 2
    exe = shutil.which(agent.command)
    if exe is None:
        print(f"superfluid: {agent.command} is not installed (not on PATH)", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{port}"
    try:
        model = ensure_server(url, port, api_key, serve_args)
    except RuntimeError as e:
        print(f"superfluid: {e}", file=sys.stderr)
        return 1
    env, lead = agent_setup(name, url, model, api_key)
    return subprocess.call([exe, *lead, *args], env={**os.environ, **env})


def stop(port: int, *, drain: bool, timeout: float) -> int:
    """Signal the server on this port (its pid file) and wait for it to exit."""
    import signal
    path = home() / "run" / f"serve-{port}.pid"
    try:
        pid = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        print(f"superfluid: no server of ours on port {port} (no {path})", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGUSR1 if drain else signal.SIGTERM)
    except ProcessLookupError:
        Path(path).unlink(missing_ok=True)
        print(f"superfluid: the server on port {port} is already gone", file=sys.stderr)
        return 1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return 0
        time.sleep(0.2)
    print(f"superfluid: the server (pid {pid}) is still running after {timeout:.0f} s", file=sys.stderr)
    return 1


def _alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for its parent to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True
