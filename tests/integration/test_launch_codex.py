"""`superfluid launch codex` end to end: a stand-in `codex` on PATH (tests/integration/
codex_stand_in.py) replays a recorded Codex request sequence (function tools, `instructions`,
function_call / function_call_output and reasoning items, `stream`, `store: false`,
`include`, `parallel_tool_calls`, `prompt_cache_key`) to the provider launch configured, and
checks each answer is a well-formed Responses stream."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from . import codex_stand_in
from .conftest import MODEL
from .daemon import Daemon

KEY = "sk-codex-launch"


@pytest.fixture(scope="module")
def d():
    daemon = Daemon("--api-key", KEY, max_batch=2, max_context=2048)
    yield daemon
    daemon.stop()


def test_launch_codex_replays_a_recorded_codex_session(d, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    codex = bin_dir / "codex"
    script = Path(__file__).with_name("codex_stand_in.py")
    codex.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    codex.chmod(codex.stat().st_mode | stat.S_IEXEC)
    rec = tmp_path / "rec.json"
    env = {**os.environ, "SUPERFLUID_HOME": d.home, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(rec),
           "CODEX_MAX_OUTPUT_TOKENS": "24"}
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "launch", "codex", "--port", str(d.port),
                        "--api-key", KEY, "--", "exec", "List the files in this directory."],
                       capture_output=True, text=True, timeout=600, env=env)
    got = json.loads(rec.read_text())
    assert r.returncode == 0, (r.stderr, got)
    assert got["base_url"] == d.url + "/v1" and got["model"] == MODEL
    assert got["argv"][-2:] == ["exec", "List the files in this directory."]
    answers = got["answers"]
    assert len(answers) == 3 and all(a["well_formed"] and a["status"] == 200 for a in answers), answers
    assert all(a["status_text"] in ("completed", "incomplete") for a in answers)
    assert answers[1]["usage"]["input_tokens_details"]["cached_tokens"] > 0  # the shared prefix was reused
    for a in answers:  # store: false is honoured: nothing of them is kept
        got = httpx.get(f"{d.url}/v1/responses/{a['id']}", headers={"authorization": f"Bearer {KEY}"}, timeout=10)
        assert got.status_code == 404


def test_the_stand_in_rejects_a_malformed_stream():
    """The stand-in's check can fail: a gap in the numbering, a missing terminal event."""
    resp = {"id": "resp_1", "output": [], "usage": {"input_tokens": 1, "output_tokens": 0}}
    good = [("response.created", {"type": "response.created", "sequence_number": 0, "response": resp}),
            ("response.in_progress", {"type": "response.in_progress", "sequence_number": 1, "response": resp}),
            ("response.completed", {"type": "response.completed", "sequence_number": 2, "response": resp})]
    assert codex_stand_in.check(good) == resp
    gap = good[:2] + [("response.completed", {**good[2][1], "sequence_number": 3})]
    for bad in (gap, good[:2], [good[1], good[0], good[2]]):
        with pytest.raises(AssertionError):
            codex_stand_in.check(bad)
