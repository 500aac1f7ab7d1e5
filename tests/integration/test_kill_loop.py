"""The kill loop's short version (tests/integration/kill_loop.py, 8 kills; bench/kill_loop.py
runs 100): four greedy streams (over chat completions, Anthropic Messages and Responses) and a
writer of native appends while the daemon is SIGKILLed at random moments and restarted on the
same home. Every stream, resumed across the kills, ends with the uncut text; every
acknowledged append is in the log exactly once; restarts do not slow down; no KV temp file
is left."""

import pytest

from .kill_loop import run

pytestmark = pytest.mark.timeout(900)


def test_kill_loop(tmp_path):
    # --deterministic: the references run alone and cold, the loop's streams beside each other
    # and warm; only then are their greedy tokens the same by contract, not up to floating
    # point (docs/sessions.md; without it a near tie flipped the first token of all four)
    out = run(str(tmp_path), kills=8, streams=4, budget=40, seed=7, daemon_args=("--deterministic",))
    print(out)
    assert out["mismatches"] == [], out["mismatches"][:2]
    assert out["log_errors"] == []
    assert out["finished"] >= 4 and out["resumed"] >= 1 and out["acked_appends"] > 0
    assert set(out["finished_by_api"]) == {"/v1/chat/completions", "/v1/messages", "/v1/responses"}, out
    assert out["tmp_files"] == []
    first, rest = out["restart_s"][1], out["restart_s"][2:]  # [0] is the first start
    assert max(rest) < 3 * first + 5, out["restart_s"]  # not growing with the kills (a generous bound)
