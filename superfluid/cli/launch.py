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

from ..api import listener
from ..config import DEFAULT_PORT, home, private_dir


HERMES_MIN = 64000
LOCAL_TIMEOUT_MS = 3_600_000  # an hour: how long a local model may take to prefill and answer


@dataclass(frozen=True)
class Agent:
    name: str
    command: str
    what: str
    window: int = 0  # the context window the agent needs (its first prompt and room to answer)
    install: str = ""


AGENTS = {
    "claude": Agent("claude", "claude", "Claude Code, through the Anthropic Messages API", 32768,
                    "npm i -g @anthropic-ai/claude-code"),
    "codex": Agent("codex", "codex", "OpenAI Codex CLI, through the Responses API", 16384, "npm i -g @openai/codex"),
    "opencode": Agent("opencode", "opencode", "opencode, through the OpenAI chat API", 16384, "npm i -g opencode-ai"),
    "pi": Agent("pi", "pi", "pi, through the OpenAI chat API", 8192, "npm i -g @mariozechner/pi-coding-agent"),
    # its first prompt (system prompt and tools) is about 5,500 tokens
    "cline": Agent("cline", "cline", "Cline CLI, through the OpenAI chat API", 16384, "npm i -g cline"),
    # Hermes refuses a model whose window is under 64,000 tokens
    "hermes": Agent("hermes", "hermes", "Hermes Agent, through the OpenAI chat API", HERMES_MIN,
                    "pip install hermes-agent (in a venv of its own: scripts/agents.sh)"),
    "ollama": Agent("ollama", "ollama", "the ollama CLI, through the Ollama API"),
}


def add_parsers(sub) -> None:
    la = sub.add_parser("launch", help="start a coding agent pointed at this server (serving first if needed)")
    la.add_argument("agent", nargs="?", help=f"{', '.join(AGENTS)}; none: list them")
    la.add_argument("args", nargs="*", help="after --: the agent's own arguments")
    la.add_argument("--port", type=int, default=DEFAULT_PORT)
    la.add_argument("--api-key", default=os.environ.get("SUPERFLUID_API_KEY"))
    st = sub.add_parser("stop", help="stop the server on a port (started by serve or launch)")
    st.add_argument("--port", type=int, default=DEFAULT_PORT)
    st.add_argument("--drain", action="store_true", help="let running requests finish first (SIGUSR1)")
    st.add_argument("--timeout", type=float, default=330.0, help="how long to wait for it to exit")


def run(args) -> int:
    """`superfluid launch` and `superfluid stop`."""
    if args.command == "stop":
        return stop(args.port, drain=args.drain, timeout=args.timeout)
    if not args.agent:
        print(listing())
        return 0
    return launch(args.agent, args.args, port=args.port, api_key=args.api_key, serve_args=[])


def listing() -> str:
    lines = ["agents superfluid can launch (superfluid launch AGENT [-- AGENT'S ARGS]):"]
    for a in AGENTS.values():
        where = shutil.which(a.command)
        state = "installed at " + where if where else f"not installed ({a.install})" if a.install else "not installed"
        lines.append(f"  {a.name:<9} {state:<48} {a.what}")
    return "\n".join(lines)


def server_model(url: str, api_key: str | None) -> tuple[str, int] | None:
    """(the default model's id, its window) if a server answers at url, else None."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url + "/v1/models", headers=headers, timeout=2)
        if r.status_code == 200:
            m = r.json()["data"][0]
            return m["id"], int((m.get("meta") or {}).get("n_ctx") or 0)
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
        pass
    return None


def ensure_server(url: str, port: int, api_key: str | None, serve_args: list[str]) -> tuple[str, int]:
    """The served model, from this user's own server on the port (started if nothing listens).
    Nothing is sent to a listener (no key, no agent) until it proves it is that server
    (api/listener.py): any local user may listen on a free port."""
    try:
        listener.check(port)
    except listener.NoListener:
        start_server(port, serve_args)
    except listener.Silent:
        pass  # a server still loading its model: wait for it below
    except listener.NotOurs as e:
        raise RuntimeError(refusal(e)) from None
    else:
        model = server_model(url, api_key)
        if model is not None:
            return model
    log = home() / "launch" / "serve.log"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            listener.check(port)
        except (listener.NoListener, listener.Silent):
            time.sleep(0.5)
            continue
        except listener.NotOurs as e:
            raise RuntimeError(refusal(e)) from None
        model = server_model(url, api_key)
        if model is not None:
            return model
        time.sleep(0.5)
    raise RuntimeError(f"the server did not come up at {url}; see {log}")


def refusal(e: Exception) -> str:
    return f"{e}. The key and the agent's requests were not sent to it; stop that program or use another --port"


def start_server(port: int, serve_args: list[str]) -> None:
    log_dir = home() / "launch"
    private_dir(log_dir)
    log = open(log_dir / "serve.log", "ab")
    cmd = [sys.executable, "-m", "superfluid.cli", "serve", "--port", str(port), "--no-tui", *serve_args]
    print(f"superfluid: nothing answers at http://127.0.0.1:{port}; starting `superfluid serve` "
          f"(log: {log_dir / 'serve.log'})", file=sys.stderr)
    subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def _file(name: str, data: object) -> Path:
    """A per-launch file of ours under <home>/launch (an agent's own config is never edited)."""
    path = home() / "launch" / name
    private_dir(home() / "launch")  # an agent's config may hold a key
    private_dir(path.parent)
    path.write_text(json.dumps(data, indent=2))
    return path


def output_limit(window: int) -> int:
    """The answer length an agent is told it may ask for: a quarter of the window."""
    return max(256, min(32000, window // 4)) if window else 4096


def codex_catalog(exe: str, model: str, window: int) -> Path | None:
    """A model catalog naming the served model, so Codex knows its window (and stops warning
    "Model metadata not found"). Built from the catalog this Codex ships (`codex debug
    models`): its plainest listed entry, renamed, without reasoning levels, image input, web
    search or a freeform apply_patch (a custom tool this server leaves out). None when this
    Codex cannot print its catalog."""
    try:
        out = subprocess.run([exe, "debug", "models"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "CODEX_HOME": os.environ.get("CODEX_HOME") or str(home() / "launch")})
        models = [m for m in json.loads(out.stdout)["models"] if m.get("visibility") == "list"]
        # the plainest entry: the newest models turn on tools that are JavaScript programs
        # (`tool_mode`, an `additional_tools` input item of freeform tools) and lite requests
        base = min(models, key=lambda m: ("tool_mode" in m, bool(m.get("use_responses_lite"))))
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError, StopIteration):
        return None
    base = {k: v for k, v in base.items() if k not in ("tool_mode", "multi_agent_version", "model_specialty")}
    entry = {**base, "slug": model, "use_responses_lite": False, "experimental_supported_tools": [],
             "display_name": model, "description": "served by superfluid",
             "context_window": window, "max_context_window": window, "supported_reasoning_levels": [],
             "default_reasoning_level": None, "upgrade": None, "availability_nux": None,
             "additional_speed_tiers": [], "service_tiers": [], "input_modalities": ["text"],
             "apply_patch_tool_type": None, "supports_search_tool": False, "priority": 0}
    return _file("codex-models.json", {"models": [entry]})


def agent_setup(name: str, url: str, model: str, api_key: str | None, window: int = 0,
                exe: str = "") -> tuple[dict[str, str], list[str], list[str]]:
    """(environment additions, variables to remove, leading arguments) for one agent."""
    token = api_key or "superfluid"
    if name == "claude":
        env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": token, "ANTHROPIC_MODEL": model,
               "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
               "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
               "CLAUDE_CODE_SUBAGENT_MODEL": model,
               # no per-request attribution line at the top of the system prompt: the prefix stays
               # the same from request to request, so the prefix cache holds it
               "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
               # it aborts a stream that has sent no content for 5 minutes (pings do not count)
               # and retries: a cold 19k-token prefill on a CPU takes longer (bench/agents.py:
               # aborted at 14k tokens), and its requests time out after 10 minutes
               "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(LOCAL_TIMEOUT_MS), "API_TIMEOUT_MS": str(LOCAL_TIMEOUT_MS)}
        if window:
            # its own check refuses to send a conversation past window - min(max output, 20000)
            # - 3000, max output defaulting to 32000 for a model it does not know: at 32k, less
            # than its own 19k-token system prompt, so no tool turn could follow the first
            env |= {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(window), "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(window),
                    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(output_limit(window))}
        return env, ["ANTHROPIC_API_KEY"], []  # an inherited Anthropic key would win over the token
    if name == "codex":
        provider = (f'model_providers.superfluid={{name="superfluid", base_url="{url}/v1", '
                    f'env_key="SUPERFLUID_API_KEY", wire_api="responses"}}')
        lead = ["-c", provider, "-c", "model_provider=superfluid", "-c", 'web_search="disabled"', "-m", model]
        catalog = codex_catalog(exe, model, window) if exe and window else None
        if catalog is not None:
            lead += ["-c", f"model_catalog_json={json.dumps(str(catalog))}"]
        return {"SUPERFLUID_API_KEY": token}, [], lead
    if name == "opencode":
        entry: dict = {"name": model}
        if window:
            entry["limit"] = {"context": window, "output": output_limit(window)}
        path = _file("opencode.json", {
            "$schema": "https://opencode.ai/config.json",
            "provider": {"superfluid": {"npm": "@ai-sdk/openai-compatible", "name": "superfluid",
                                        "options": {"baseURL": f"{url}/v1", "apiKey": token},
                                        "models": {model: entry}}},
            "model": f"superfluid/{model}"})
        return {"OPENCODE_CONFIG": str(path)}, [], []
    if name == "pi":  # pi reads models.json from its agent folder: one of ours
        entry = {"id": model, "contextWindow": window or 8192, "maxTokens": output_limit(window)}
        path = _file("pi/models.json", {"providers": {"superfluid": {
            "baseUrl": f"{url}/v1", "api": "openai-completions", "apiKey": token,
            "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False}, "models": [entry]}}})
        return {"PI_CODING_AGENT_DIR": str(path.parent), "PI_OFFLINE": "1"}, [], \
            ["--provider", "superfluid", "--model", model]
    if name == "cline":  # its provider settings file is ours (CLINE_PROVIDER_SETTINGS_PATH): the
        # rest of its config (~/.cline: rules, MCP servers, history) stays the user's. It reads
        # only a complete file (`modes`, `updatedAt`), else it falls back to its own provider.
        settings = {"provider": "openai-compatible", "apiKey": token, "model": model, "baseUrl": f"{url}/v1",
                    "maxTokens": output_limit(window)}
        if window:
            settings["contextWindow"] = window
        path = _file("cline/providers.json", {
            "version": 1, "lastUsedProvider": "openai-compatible", "modes": {},
            "providers": {"openai-compatible": {"settings": settings, "tokenSource": "manual",
                                                "updatedAt": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())}}})
        return {"CLINE_PROVIDER_SETTINGS_PATH": str(path)}, [], []
    if name == "hermes":  # its endpoint can only come from config.yaml in its home: one of ours
        told = max(window, HERMES_MIN)  # under its minimum it will not start (launch has warned)
        path = _file("hermes/config.yaml", {  # JSON is YAML
            "model": {"provider": "custom", "base_url": f"{url}/v1", "default": model, "api_key": token,
                      # it takes this server for Ollama (it answers /api/tags) and then checks num_ctx too
                      "context_length": told, "ollama_num_ctx": told},
            "security": {"allow_lazy_installs": False}})  # no pip installs of tools' packages at run time
        return {"HERMES_HOME": str(path.parent), "HERMES_DISABLE_LAZY_INSTALLS": "1"}, [], []
    if name == "ollama":
        return {"OLLAMA_HOST": url}, [], []
    raise KeyError(name)


def launch(name: str, args: list[str], *, port: int, api_key: str | None, serve_args: list[str]) -> int:
    agent = AGENTS.get(name)
    if agent is None:
        print(f"superfluid: unknown agent '{name}'\n{listing()}", file=sys.stderr)
        return 2
    exe = shutil.which(agent.command)
    if exe is None:
        hint = f": {agent.install}" if agent.install else ""
        print(f"superfluid: {agent.command} is not installed (not on PATH){hint}", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{port}"
    try:
        model, window = ensure_server(url, port, api_key, serve_args)
    except RuntimeError as e:
        print(f"superfluid: {e}", file=sys.stderr)
        return 1
    if window and window < agent.window:
        print(f"superfluid: {agent.name} needs a window of about {agent.window} tokens; {model} is served with "
              f"{window}, so its requests may not fit. Serve it with `superfluid serve --max-context "
              f"{agent.window}` (add --rope-scaling yarn past the model's trained window; docs/agents.md)",
              file=sys.stderr)
    env, drop, lead = agent_setup(name, url, model, api_key, window, exe)
    child = {k: v for k, v in os.environ.items() if k not in drop} | env
    return subprocess.call([exe, *lead, *args], env=child)


def stop(port: int, *, drain: bool, timeout: float) -> int:
    """Signal the server on this port (its pid file) and wait for it to exit."""
    import signal
    path = home() / "run" / f"serve-{port}.pid"
    try:
        pid = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        print(f"superfluid: no server of ours on port {port} (no {path})", file=sys.stderr)
        return 1
    if not _our_server(pid):  # a stale pid file: the pid may be anyone's process now
        Path(path).unlink(missing_ok=True)
        print(f"superfluid: the server on port {port} is already gone (pid {pid} is another program now)",
              file=sys.stderr)
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


def _our_server(pid: int) -> bool:
    """Whether `pid` runs `superfluid serve` (its command line says so; where the system has no
    /proc to read, whether it exists)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except FileNotFoundError:
        return not os.path.isdir("/proc/self") and _alive(pid)
    except OSError:
        return False
    return any(b"superfluid" in a for a in args) and b"serve" in args


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
