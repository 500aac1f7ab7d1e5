"""The KV disk tier through the real daemon: a conversation's KV outlives a restart, its next
turn restores it instead of prefilling (usage shows the restored tokens), greedy output is the
same as after a fresh prefill, and a corrupt entry is ignored, deleted and prefilled instead."""

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from superfluid.client import Client

from .daemon import Daemon

DOC = " ".join(f"lantern{i} meadow copper" for i in range(70))
Q = [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": f"Here is a list: {DOC}\nWhich word comes first?"}]


def chat(d: Daemon, messages: list[dict]) -> tuple[str, int, int]:
    """(text, prompt tokens, cached tokens) of a greedy 8-token answer."""
    r = httpx.post(d.url + "/v1/chat/completions", timeout=300, json={
        "model": "SmolLM2-135M-Instruct", "messages": messages, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    b = r.json()
    return (b["choices"][0]["message"]["content"], b["usage"]["prompt_tokens"],
            (b["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def metric(d: Daemon, name: str, key: str | None = None) -> float:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    for line in httpx.get(d.url + "/metrics", timeout=10, headers=headers).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def reference():
    """Answers after a fresh prefill, from a daemon without the disk tier."""
    d = Daemon("--kv-disk", "off", max_context=2048)
    try:
        a, n, cached = chat(d, Q)
        assert cached == 0
        q2 = Q + [{"role": "assistant", "content": a}, {"role": "user", "content": "And the last word?"}]
        a2, _, _ = chat(d, q2)
        assert not list(Path(d.home).glob("kv/*/*.kv"))  # --kv-disk off writes nothing
        yield {"q": a, "q2": q2, "a2": a2, "n": n}
    finally:
        d.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kvhome"))


def test_a_turn_is_restored_after_a_restart_with_identical_output(reference, home):
    d = Daemon(max_context=2048, home=home)
    try:
        text, n, cached = chat(d, Q)
        assert (text, cached) == (reference["q"], 0)
    finally:
        d.stop()  # queued saves reach the disk as the worker stops
    files = list(Path(home).glob("kv/*/*.kv"))
    assert len(files) == 1 and files[0].stat().st_size > 20_000 * n  # ~23 kB a token
    d = Daemon(max_context=2048, home=home)
    try:
        text, _, cached = chat(d, Q)
        assert text == reference["q"]
        assert cached == n - 1  # all but the last prompt token, which is fed again for its logits
        assert metric(d, "superfluid_restores_total") == 1
        assert metric(d, "superfluid_kv_restored_bytes_total") >= files[0].stat().st_size - 4096
    finally:
        d.stop()


def test_the_next_turn_restores_then_prefills_the_rest(reference, home):
    d = Daemon(max_context=2048, home=home)
    try:
        text, n2, cached = chat(d, reference["q2"])
        assert text == reference["a2"]
        assert reference["n"] - 1 <= cached < n2 - 5  # the old turn restored, the new message prefilled
    finally:
        d.stop()


def test_a_corrupt_entry_is_deleted_and_the_prompt_prefilled(reference, home):
    files = list(Path(home).glob("kv/*/*.kv"))
    assert files
    for f in files:
        raw = bytearray(f.read_bytes())
        raw[-5000] ^= 0xFF
        f.write_bytes(bytes(raw))
    d = Daemon(max_context=2048, home=home)
    try:
        text, _, cached = chat(d, reference["q2"])
        assert text == reference["a2"] and cached == 0
        assert not any(f.exists() for f in files)
    finally:
        d.stop()


def test_a_generation_cut_by_a_crash_continues_from_the_saved_prompt(tmp_path):
    """SIGKILL mid-answer: the long prompt's KV was saved once prefilled, so the continued
    turn after the restart restores it instead of prefilling it again."""
    home = str(tmp_path)
    d = Daemon(max_context=2048, home=home)
    with Client(d.url) as c:
        sid = c.create(system="Be brief.", temperature=0)["id"]
        c.append(sid, "user", f"Repeat this list twice: {DOC} {DOC[:1500]}")
        for i, _ in enumerate(c.stream(sid, max_tokens=200)):
            if i == 3:
                deadline = time.monotonic() + 30  # the writer thread puts the prompt's KV on disk
                while not list(Path(home).glob("kv/*/*.kv")) and time.monotonic() < deadline:
                    time.sleep(0.05)
                os.kill(d.proc.pid, signal.SIGKILL)
                break
    d.proc.wait(10)
    assert list(Path(home).glob("kv/*/*.kv"))
    d = Daemon(max_context=2048, home=home)
    try:
        with Client(d.url) as c:
            out = c.generate(sid, max_tokens=4)
            assert out["text"]
        assert metric(d, "superfluid_restores_total") == 1
        assert metric(d, "superfluid_restored_tokens_total") >= 512
    finally:
        d.stop()


def test_a_keys_entry_is_restored_after_a_restart_for_that_key_only(tmp_path):
    """Each API key has its own prefix-cache namespace (issue 33), on disk too: the entry key A's
    turn left is restored for A after a restart (its namespace read back from the file by
    the new worker), and B's identical prompt is prefilled cold."""
    policy = tmp_path / "keys.json"
    policy.write_text('{"keys": [{"name": "a", "key": "sk-key-a-000"}, {"name": "b", "key": "sk-key-b-000"}, '
                      '{"name": "ops", "key": "sk-admin-000", "admin": true}]}')  # /metrics: an admin key's
    home = str(tmp_path / "home")

    def ask(d: Daemon, key: str) -> int:
        r = httpx.post(d.url + "/v1/chat/completions", timeout=300, headers={"authorization": f"Bearer {key}"},
                       json={"messages": Q, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    d = Daemon("--key-policy", str(policy), max_context=2048, home=home)
    try:
        assert ask(d, "sk-key-a-000") == 0
    finally:
        d.stop()
    assert len(list(Path(home).glob("kv/*/*.kv"))) == 1
    d = Daemon("--key-policy", str(policy), max_context=2048, home=home)
    try:
        assert ask(d, "sk-key-b-000") == 0
        assert ask(d, "sk-key-a-000") > 300  # restored from A's own entry
        assert metric(d, "superfluid_restores_total", "sk-admin-000") == 1
    finally:
        d.stop()
