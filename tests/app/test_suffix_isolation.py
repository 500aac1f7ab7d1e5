"""Suffix drafts never carry one key's output into another's generation (issue 54): in one
process (tests/harness.py), the real engine, scheduler and Link W codec feeding the suffix
drafter (runtime/suffix.py) as a worker's runtime feeds it. Key A's answer, once produced,
drafts for A's next request and for nobody else: not key B, not A under a `cache_salt`. Before
the fix a lane open crossed Link W without its namespace, so every key shared one tree."""

from __future__ import annotations

import os

import pytest

from superfluid.api import cache_ns
from superfluid.api.policy import KeyPolicy
from superfluid.runtime import suffix_store

from ..fakes import FakeModel
from ..harness import MODEL, run

try:
    from superfluid.runtime import suffix
    suffix.suffix_tree_class()
except Exception:  # noqa: BLE001 -- arctic-inference not installed: CI installs it (.ci/run)
    if os.environ.get("CI"):
        raise
    pytest.skip("arctic-inference is not installed (pip install --no-build-isolation arctic-inference)",
                allow_module_level=True)

A = {"authorization": "Bearer sk-key-a-000"}
B = {"authorization": "Bearer sk-key-b-000"}
KEYS = (KeyPolicy("a", "sk-key-a-000"), KeyPolicy("b", "sk-key-b-000"))
SECRET = "Account 4417-QX paid 93.20 EUR on 9 May; the PIN reset code is 660-281-ZK."


def drafts(d, ns: str, ctx: list[int]) -> list[int]:
    """What the drafter proposes to a lane of namespace `ns` that has begun `ctx`."""
    d.begin(999, ns)
    try:
        return d.propose({999: (ctx, 8)}).get(999, [])
    finally:
        d.lanes.pop(999, None)


def test_a_keys_output_drafts_for_that_key_alone(tmp_path):
    m = FakeModel()
    answer = m.vocab.script(SECRET)
    m.reply = lambda prompt: answer
    path = str(tmp_path / "suffix" / "m.bin")

    async def body(h):
        d = h.model.runtime.drafter = suffix.SuffixDrafter(path)  # as registry.load_runtime attaches it
        r = await h.client.post("/v1/chat/completions", headers=A, json={
            "model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": "my statement?"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == SECRET, r.text
        begun = [7, 8] + answer[:12]  # a later lane that has begun A's answer
        return {"a": drafts(d, cache_ns.of_key("a"), begun), "b": drafts(d, cache_ns.of_key("b"), begun),
                "a salted": drafts(d, cache_ns._hash(f"{cache_ns.of_key('a')}\0salt\0s1"), begun),
                "shared": drafts(d, "", begun), "namespaces": set(d.globals)}
    out = run(body, m, policies=KEYS)
    assert out["a"] == answer[12:20], out  # A's own next request drafts its earlier answer
    assert out["b"] == [] and out["a salted"] == [] and out["shared"] == [], out
    assert out["namespaces"] == {cache_ns.of_key("a")}, out
    on_disk = suffix_store.OutputFile(path).load()
    assert [ns for ns, _, _ in on_disk] == [cache_ns.of_key("a")]  # the file files it under A's namespace too


def test_a_store_false_output_never_reaches_the_suffix_file(tmp_path):
    m = FakeModel()
    answer = m.vocab.script(SECRET)
    m.reply = lambda prompt: answer
    path = str(tmp_path / "suffix" / "m.bin")

    async def body(h):
        h.model.runtime.drafter = suffix.SuffixDrafter(path)
        r = await h.client.post("/v1/responses", headers=A, json={"model": MODEL, "input": "my statement?",
                                                                  "store": False, "max_output_tokens": 200})
        assert r.status_code == 200, r.text
        await h.client.post("/v1/chat/completions", headers=A, json={  # the lane is reused: the first retired
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "something else"}]})
    run(body, m, policies=KEYS, max_batch=1)
    kept = [list(t) for _, t, _ in suffix_store.OutputFile(path).load()]
    assert kept and not any(t[:len(answer)] == answer for t in kept), kept  # the chat's two tokens only


def secret_on_disk(path: str, answer: list[int]) -> bool:
    """Whether the file's bytes hold the answer's tokens anywhere (not only as a record)."""
    from array import array
    with open(path, "rb") as f:
        return array("i", answer).tobytes() in f.read()


@pytest.mark.parametrize("erasure", ["purge", "prune"])
def test_erasing_a_session_erases_its_output_from_the_suffix_file(tmp_path, erasure):
    """Issue 54: before, the suffix file kept every output whatever was erased: a purged
    session's answer, or one retention pruned, stayed on disk for the next worker to draft from."""
    m = FakeModel()
    answer = m.vocab.script(SECRET)
    m.reply = lambda prompt: answer
    path = str(tmp_path / "suffix" / "m.bin")  # where registry.suffix_file puts it under --kv-dir
    admin = {"authorization": "Bearer sk-admin-000"}

    async def body(h):
        d = h.model.runtime.drafter = suffix.SuffixDrafter(path)
        r = await h.client.post("/v1/chat/completions", headers=A, json={
            "model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": "my statement?"}]})
        assert r.status_code == 200, r.text
        await h.client.post("/v1/chat/completions", headers=B, json={  # the lane is reused: A's retired
            "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
        before = secret_on_disk(path, answer)
        if erasure == "purge":
            sid = r.headers["x-superfluid-session"]
            assert (await h.client.delete(f"/v1/sessions/{sid}", headers=A)).status_code == 200
        else:
            r = await h.client.post("/v1/sessions/prune", headers=admin, json={"older_than_days": 0})
            assert r.status_code == 200 and r.json()["erased"] >= 1, r.text
        after = secret_on_disk(path, answer)
        return before, after, drafts(d, cache_ns.of_key("a"), [7, 8] + answer[:12])
    before, after, drafted = run(body, m, policies=KEYS + (KeyPolicy("admin", "sk-admin-000", admin=True),),
                                 max_batch=1, kv_dir=str(tmp_path))
    assert before and not after
    assert drafted == []  # the worker's memory let go of it too
