"""The real coding agents, installed from npm by .ci/run (scripts/agents.sh pins them), each
driven through `superfluid launch` against one real daemon serving the embedded model with a
32k window (YaRN), non-interactively: the agent exits 0, prints the model's words, and every
request it sent got a 2xx in the daemon's access log. Greedy sampling (--temp 0) and an
output cap (--max-output) keep a small model's answers short; nothing about the agents is
changed."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from .daemon import Daemon
from .forcing_proxy import ForcingProxy

WINDOW = 32768
# each agent's first prompt is prefilled cold: 2-5 minutes on two cores (Claude Code's 19k tokens)
pytestmark = pytest.mark.timeout(1500)
# a greedy 135M model can repeat itself until the window ends (24k tokens: ten minutes here);
# the operator's cap (llama-server's -n) ends such an answer with `length`
MAX_OUTPUT = 256


class LoggedDaemon(Daemon):
    """A daemon whose JSON access log is read as it is written (records, in order)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.records: list[dict] = []
        self.lines: list[str] = [*self.startup, self.banner]
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("{") and '"path"' in line:
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    pass


@pytest.fixture(scope="module")
def d():
    daemon = LoggedDaemon("--rope-scaling", "yarn", "--temp", "0", "--max-output", str(MAX_OUTPUT),
                          "--log-format", "json", max_context=WINDOW, max_batch=1, threads=2)
    yield daemon
    daemon.stop()


def test_the_window_is_stretched_and_said(d):
    """A window four times the embedded model's trained one through YaRN: the daemon says so and
    /v1/models reports it; a short chat still answers. Claude Code's first prompt (about 20k
    tokens, test_claude_one_shot) is the prompt past the trained window."""
    deadline = time.monotonic() + 10  # the rope line is logged before the serving line
    while not any("serving" in x for x in d.lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(f"window {WINDOW} tokens (yarn x4 over the trained 8192)" in x for x in d.lines), d.lines[:20]
    (model,) = httpx.get(d.url + "/v1/models", timeout=10).json()["data"]
    assert (model["meta"]["n_ctx"], model["meta"]["n_ctx_train"]) == (WINDOW, 8192)
    r = httpx.post(d.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].strip()


def need(command: str) -> str:
    exe = shutil.which(command)
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail(f"{command} is not installed: .ci/run installs it (scripts/agents.sh)")
        pytest.skip(f"{command} is not installed (bash scripts/agents.sh installs the pinned agents)")
    return exe


def launch(d, tmp_path, agent: str, *args: str, env: dict | None = None,
           port: int | None = None) -> tuple[subprocess.CompletedProcess, list]:
    """`superfluid launch AGENT -- ARGS` in a folder of its own (tmp_path/work); (the run, the
    access-log records of the requests it made). `port`: another way to the daemon (a proxy)."""
    need(agent)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    start = len(d.records)
    base = {**os.environ, "SUPERFLUID_HOME": d.home, "HOME": str(tmp_path), "CODEX_HOME": str(tmp_path / "codex"),
            "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "NO_COLOR": "1"}
    (tmp_path / "codex").mkdir(exist_ok=True)
    if port and port != d.port:  # a proxy of ours: it proves what the server proves (api/listener.py)
        shutil.copy(Path(d.home) / "run" / f"serve-{d.port}.token", Path(d.home) / "run" / f"serve-{port}.token")
    t0 = time.monotonic()
    base["PWD"] = str(work)  # agents take the folder from $PWD (opencode), which cwd= does not set
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "launch", agent, "--port", str(port or d.port), "--",
                        *args],
                       cwd=work, capture_output=True, text=True, timeout=1200, env={**base, **(env or {})},
                       stdin=subprocess.DEVNULL)
    print(f"{agent}: exit {r.returncode} in {time.monotonic() - t0:.1f} s")
    time.sleep(0.5)  # the last access-log line is written as the response ends
    return r, [x for x in d.records[start:] if x["path"] != "/health"]


def check(r: subprocess.CompletedProcess, recs: list, path: str, probes: tuple = ()) -> None:
    """The agent exited 0 and asked `path`; every request it made got a 2xx, but for the
    `probes` (paths it tries to learn what the server is, and is fine without)."""
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:], recs)
    asked = [x for x in recs if x["path"] == path]
    assert asked, (path, recs)
    assert all(200 <= x["status"] < 300 for x in recs if x["path"] not in probes), recs


def words(text: str) -> bool:
    return any(c.isalpha() for c in text)


SECRET = "the launch code is 7291"
LOOPS = {  # agent: (its arguments, the tool it is made to call, the call's arguments, its API)
    "pi": (["-p"], "read", {"path": "note.txt"}, "/v1/chat/completions"),
    "opencode": (["run"], "read", {"filePath": "{work}/note.txt"}, "/v1/chat/completions"),
    "cline": ([], "read_files", {"files": [{"path": "{work}/note.txt"}]}, "/v1/chat/completions"),
    "codex": (["exec", "--skip-git-repo-check"], "exec_command", {"cmd": "cat note.txt"}, "/v1/responses"),
    "hermes": (None, "read_file", {"path": "{work}/note.txt"}, "/v1/chat/completions"),
}
# Codex fails a run whose answer the output cap cut (`max_output_tokens`), and a greedy 135M
# model can ramble into the cap on some prompts (Codex's carries the folder and the date), so
# its answers are held to a short JSON string (forcing_proxy.py); its requests are its own.
# The string starts with a letter: left to "a short string", the greedy model answered Claude
# Code's one-shot with "1.1.1.1..." in one CI run (its prompt carries the date and the folder)
SHORT = {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9 ,.!'-]{0,39}$"}


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    """One folder per agent, for its one-shot and its tool loop. Agents put the folder in their
    prompt, so in the same folder, and through a proxy that renders the tools the same, the
    loop's first request finds the one-shot's prompt cached up to the user's words instead of
    prefilling it cold again (Claude Code's 19k tokens: eight minutes on two cores)."""
    made: dict = {}

    def home(agent: str):
        if agent not in made:
            made[agent] = tmp_path_factory.mktemp(agent)
            (made[agent] / "work").mkdir()
            (made[agent] / "work" / "note.txt").write_text(SECRET + "\n")
        return made[agent]
    yield home
    end_left_behind([str(p) for p in made.values()])


def end_left_behind(folders: list[str]) -> None:
    """Processes an agent left running once it exited (Cline's hub daemon, `--cwd <its work
    folder>`) end with the agents' tests: any process whose HOME is one of `folders` or whose
    command line names one."""
    left = []
    for p in psutil.process_iter():
        try:
            args, home = p.cmdline(), p.environ().get("HOME", "")
        except psutil.Error:
            continue
        if p.pid != os.getpid() and (home in folders or any(f in a for a in args for f in folders)):
            left.append(p)
    for p in left:
        p.terminate()
    for p in psutil.wait_procs(left, timeout=5)[1]:
        p.kill()


def loop_proxy(d, home, agent: str, *, choose: bool, answer: dict | None) -> ForcingProxy:
    """The proxy of `agent`'s tool loop (LOOPS, or Claude Code's Read); `choose=False` never
    forces the call, so a one-shot through it renders the same tools as the loop."""
    tool, call = CLAUDE_READ if agent == "claude" else LOOPS[agent][1:3]
    call = json.loads(json.dumps(call).replace("{work}", str(home / "work")))
    return ForcingProxy(d.url, tool, call, choose=choose, answer=answer)


def one_shot(d, home, agent: str, *args: str, answer: dict | None = None, after: tuple = ()) -> tuple:
    """`agent ARGS "Reply with one word: hello" AFTER` in its folder, through its loop's proxy:
    it exits 0 having asked its API and printed the model's words."""
    proxy = loop_proxy(d, home, agent, choose=False, answer=answer)
    try:
        r, recs = launch(d, home, agent, *args, "Reply with one word: hello", *after, port=proxy.port)
    finally:
        proxy.close()
    check(r, recs, "/v1/messages" if agent == "claude" else LOOPS[agent][3])
    assert not proxy.forced
    assert words(r.stdout), r.stdout
    return r, recs


def test_pi_one_shot(d, homes):
    one_shot(d, homes("pi"), "pi", "-p")


def test_cline_one_shot(d, homes):
    one_shot(d, homes("cline"), "cline")


def test_opencode_one_shot(d, homes):
    one_shot(d, homes("opencode"), "opencode", "run")


def test_codex_one_shot(d, homes):
    r, _ = one_shot(d, homes("codex"), "codex", "exec", "--skip-git-repo-check", answer=SHORT)
    assert "Model metadata" not in r.stderr  # launch's catalog told Codex the model and its window


# The answer is held to a short JSON string in both Claude Code tests: a greedy 135M model left
# free called Claude Code's tools ten times over in one bench run (11 requests, 16 minutes)
CLAUDE_READ = ("Read", {"file_path": "{work}/note.txt"})


def test_claude_one_shot(d, homes):
    _, recs = one_shot(d, homes("claude"), "claude", "-p", answer=SHORT, after=("--allowedTools", "Read"))
    # its first prompt is past the embedded model's trained window (8,192), in the YaRN window
    assert max(x.get("prompt_tokens", 0) for x in recs if x["path"] == "/v1/messages") > 8192, recs


def test_claude_tool_loop(d, homes):
    """Claude Code is made to call Read on a note (its permission given by --allowedTools); the
    note reaches the model, and the loop's big requests after its first reuse the cached prefix
    (≥ 80%). After the forced call the answer is a short JSON string (forcing_proxy.py)."""
    home = homes("claude")
    proxy = loop_proxy(d, home, "claude", choose=True, answer=SHORT)
    try:
        r, recs = launch(d, home, "claude", "-p", "Read note.txt and tell me what it says.",
                         "--allowedTools", "Read", port=proxy.port)
    finally:
        proxy.close()
    check(r, recs, "/v1/messages")
    assert proxy.forced, [p for p, _ in proxy.bodies]
    later = [json.dumps(b) for p, b in proxy.bodies[proxy.forced_at + 1:] if p.startswith("/v1/messages")]
    assert any("7291" in b for b in later), "the tool's result never reached the model"
    big = [x for x in recs if x["path"] == "/v1/messages" and x.get("prompt_tokens", 0) > 10000]
    assert len(big) >= 2, recs
    assert all(x["cached_tokens"] >= 0.8 * x["prompt_tokens"] for x in big[1:]), big  # the first may be cold


def hermes_run(d, home, prompt: str, toolsets: str, port: int | None = None) -> tuple:
    """`hermes -z PROMPT`: its exit code does not say whether the turn ended (it exits 0 on a
    failed one), so its usage file must say the turn completed."""
    usage = home / "usage.json"
    r, recs = launch(d, home, "hermes", "-z", prompt, "-t", toolsets, "--usage-file", str(usage), port=port)
    check(r, recs, "/v1/chat/completions", probes=("/api/v1/models",))
    u = json.loads(usage.read_text())
    assert u.get("completed") is True and not u.get("failed"), u
    return r, recs


def test_hermes_one_shot(d, homes):
    r, _ = hermes_run(d, homes("hermes"), "Reply with one word: hello", "safe")
    assert words(r.stdout), r.stdout


@pytest.mark.parametrize("agent", list(LOOPS))
def test_tool_loop(d, homes, agent):
    """The agent's first request is made to call a tool that reads a file (forcing_proxy.py: the
    real model writes the call under a grammar); the real agent runs it, sends the result back,
    the model answers and the agent finishes. Its one-shot, in the same folder, warmed the
    prompt; the first request here reuses it."""
    args, _, _, path = LOOPS[agent]
    home = homes(agent)
    proxy = loop_proxy(d, home, agent, choose=True, answer=SHORT)
    prompt = "Read note.txt and tell me what it says."
    try:
        if agent == "hermes":
            _, recs = hermes_run(d, home, prompt, "file", port=proxy.port)
        else:
            r, recs = launch(d, home, agent, *args, prompt, port=proxy.port)
            check(r, recs, path)
    finally:
        proxy.close()
    assert proxy.forced, [p for p, _ in proxy.bodies]
    later = [json.dumps(b) for p, b in proxy.bodies[proxy.forced_at + 1:] if p.startswith(path)]
    assert any("7291" in b for b in later), "the tool's result never reached the model"
    first = next(x for x in recs if x["path"] == path)
    print(f"{agent}: first request {first.get('prompt_tokens')} tokens, {first.get('cached_tokens')} cached")
