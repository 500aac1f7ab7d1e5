"""A window four times the embedded model's trained one (8192 -> 32768 tokens a lane) through
YaRN rope scaling: the daemon says so, /v1/models reports it, and a prompt past the trained
window is accepted and answered. One daemon, one long prefill of about 8,500 tokens."""

import httpx
import pytest

from .daemon import Daemon

WINDOW = 32768


@pytest.fixture(scope="module")
def daemon():
    d = Daemon("--rope-scaling", "yarn", max_context=WINDOW, max_batch=1, threads=2)
    yield d
    d.stop()


def said(d: Daemon) -> list[str]:
    """The daemon's output up to its serving line, which was printed before /health answered:
    reading to it never blocks. The rope line is logged before the model loads, so before it."""
    lines = [d.banner]
    while lines[-1] and "serving" not in lines[-1]:  # "": the daemon exited
        lines.append(d.proc.stdout.readline())
    return lines


def test_the_window_is_stretched_and_said(daemon):
    lines = said(daemon)
    assert any(f"window {WINDOW} tokens (yarn x4 over the trained 8192)" in line for line in lines), lines
    (model,) = httpx.get(daemon.url + "/v1/models", timeout=10).json()["data"]
    assert (model["meta"]["n_ctx"], model["meta"]["n_ctx_train"]) == (WINDOW, 8192)


def test_a_short_chat_still_answers(daemon):
    r = httpx.post(daemon.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].strip()


@pytest.mark.timeout(600)  # the 8.5k-token prefill: about 1.5 minutes on 2 quiet cores, more on a busy machine
def test_a_prompt_past_the_trained_window_is_answered(daemon):
    # 400 notes: 8,547 tokens, just past the trained 8,192 (the prefill's cost grows faster than
    # its length: 10,087 tokens took 142 s in CI)
    lines = "".join(f"Note {i}: the parcel for house {i} goes to street {i % 97}.\n" for i in range(400))
    r = httpx.post(daemon.url + "/v1/completions", timeout=580, json={
        "prompt": lines + "Note 400: the parcel for house 400 goes to street", "max_tokens": 4, "temperature": 0,
        "ignore_eos": True})  # greedy text depends on the threads the worker gets: never assert it
    assert r.status_code == 200, r.text
    body = r.json()
    assert 8192 < body["usage"]["prompt_tokens"] < WINDOW
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["finish_reason"] == "length"
