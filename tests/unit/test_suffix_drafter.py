"""The suffix drafter (runtime/suffix.py) on Arctic Inference's suffix tree, driven as the
runtime drives it: a lane's own context, other lanes' outputs by namespace, the bounds."""

from __future__ import annotations

import os
from array import array

import pytest

from superfluid.plan import PLACEHOLDER

try:
    from superfluid.runtime import suffix, suffix_store
    suffix.suffix_tree_class()
except Exception:  # noqa: BLE001 -- arctic-inference not installed: CI installs it (.ci/run)
    if os.environ.get("CI"):
        raise
    pytest.skip("arctic-inference is not installed (pip install --no-build-isolation arctic-inference)",
                allow_module_level=True)

ANSWER = list(range(100, 140))  # an output: 40 distinct tokens


def run(d, seq: int, ns: str, prompt: list[int], out: list[int]) -> None:
    """A lane that was given `prompt` and produced `out`, then retired."""
    d.begin(seq, ns)
    for t in out:
        d.produced(seq, t)
    d.end(seq)


def test_an_earlier_output_is_drafted_for_another_lane_of_the_same_namespace():
    d = suffix.SuffixDrafter()
    run(d, 0, "", [1, 2, 3], ANSWER)
    d.begin(1, "")
    ctx = [7, 8, 9] + ANSWER[:10]  # the new lane has begun the same answer
    got = d.propose({1: (ctx, 8)})[1]
    assert got == ANSWER[10:18]


def test_a_draft_is_no_longer_than_the_match_and_k():
    d = suffix.SuffixDrafter()
    run(d, 0, "", [1], ANSWER)
    d.begin(1, "")
    assert d.propose({1: ([5, 6] + ANSWER[:3], 8)})[1] == ANSWER[3:6]  # a 3-token match drafts 3
    assert d.propose({1: ([5, 6] + ANSWER[:12], 4)})[1] == ANSWER[12:16]  # k bounds it


def test_another_namespace_never_sees_the_output():
    d = suffix.SuffixDrafter()
    run(d, 0, "key-a", [1], ANSWER)
    d.begin(1, "key-b")
    assert d.propose({1: ([9] + ANSWER[:10], 8)}) == {}
    d.begin(2, "key-a")
    assert d.propose({2: ([9] + ANSWER[:10], 8)})[2] == ANSWER[10:18]


def test_nothing_repeats_nothing_is_drafted():
    d = suffix.SuffixDrafter()
    d.begin(0, "")
    assert d.propose({0: (list(range(1000, 1200)), 8)}) == {}


def test_the_lanes_own_context_is_drafted_and_forgotten_when_the_lane_is_opened_again():
    d = suffix.SuffixDrafter()
    d.begin(0, "")
    code = list(range(500, 530))
    ctx = code + [1, 2] + code[:6]  # the prompt's code being written again
    assert d.propose({0: (ctx, 5)})[0] == code[6:11]
    assert d.propose({0: (ctx + code[6:9], 5)})[0] == code[9:14]  # the lane grew: its tree too
    # the lane is opened again for a prompt that shares only its first tokens (kept KV)
    d.begin(0, "")
    other = code[:4] + list(range(900, 930)) + code[:6]
    assert d.propose({0: (other, 5)}) == {}
    # a context whose last held token differs (not a prefix of the one drafted from) is not trusted
    d.begin(1, "")
    assert d.propose({1: (ctx, 5)})[1] == code[6:11]
    assert d.propose({1: (list(range(900, 930)) + [7] * 8 + code[:6], 5)}) == {}


def test_unknown_tokens_end_a_draft():
    d = suffix.SuffixDrafter()
    d.begin(0, "")
    ctx = [1, 2, 3, 4, PLACEHOLDER, 6, 7, 8, 1, 2, 3, 4]
    assert d.propose({0: (ctx, 5)}) == {}  # the continuation begins with an unknown token
    d.begin(0, "")
    ctx = [1, 2, 3, 4, 5, PLACEHOLDER, 7, 8, 1, 2, 3, 4]
    assert d.propose({0: (ctx, 5)}).get(0) == [5]


def test_a_running_lanes_output_is_shared_as_it_is_produced():
    d = suffix.SuffixDrafter()
    d.begin(0, "")
    for t in ANSWER[:20]:
        d.produced(0, t)
    d.begin(1, "")
    d.propose({0: ([1] + ANSWER[:20], 1)})  # lane 0's drafting flushes its output so far
    assert d.propose({1: ([3] + ANSWER[:8], 6)})[1] == ANSWER[8:14]


def test_the_oldest_outputs_leave_first_past_the_bounds(monkeypatch):
    monkeypatch.setattr(suffix, "MAX_OUTPUTS", 2)
    d = suffix.SuffixDrafter()
    outs = [list(range(1000 * i, 1000 * i + 30)) for i in range(1, 4)]
    for i, out in enumerate(outs):
        run(d, i, "", [1], out)
    assert len(d.outputs) == 2 and d.tokens == 60
    d.begin(5, "")
    assert d.propose({5: ([7] + outs[0][:8], 4)}) == {}  # the first output was evicted
    assert d.propose({5: ([7] + outs[2][:8], 4)})[5] == outs[2][8:12]
    monkeypatch.setattr(suffix, "MAX_TOKENS", 40)
    run(d, 6, "ns", [1], list(range(7000, 7030)))  # the token bound: only the newest stays
    assert d.tokens == 30 and [ns for ns, _ in d.outputs] == ["ns"]
    assert "" not in d.globals  # a namespace's tree goes with its last output


def test_outputs_outlive_the_drafter_in_its_file(tmp_path):
    path = str(tmp_path / "suffix" / "m.bin")
    d = suffix.SuffixDrafter(path)
    run(d, 0, "", [1], ANSWER)
    run(d, 1, "key-a", [1], [9, 8, 7, 6, 5, 4, 3])
    d.begin(2, "")
    d.produced(2, 77)  # a lane still running when the worker goes: its output is not kept
    d.close()
    again = suffix.SuffixDrafter(path)
    again.begin(0, "")
    assert again.propose({0: ([5] + ANSWER[:10], 8)})[0] == ANSWER[10:18]
    again.begin(1, "key-a")  # namespaces too
    assert again.propose({1: ([1, 9, 8, 7], 3)})[1] == [6, 5, 4]
    assert again.propose({0: ([1, 9, 8, 7], 3)}) == {}
    assert again.tokens == len(ANSWER) + 7


def test_a_torn_or_garbled_file_is_read_up_to_its_last_sound_record(tmp_path):
    path = tmp_path / "m.bin"
    d = suffix.SuffixDrafter(str(path))
    run(d, 0, "", [1], ANSWER)
    d.close()
    with open(path, "ab") as f:
        f.write(b"\xff\xff\x00garbage")  # a namespace longer than allowed: the read stops there
    again = suffix.SuffixDrafter(str(path))
    again.begin(0, "")
    assert again.propose({0: ([5] + ANSWER[:10], 8)})[0] == ANSWER[10:18]
    path.write_bytes(b"not a suffix file at all")
    assert suffix.SuffixDrafter(str(path)).tokens == 0
    with open(path, "wb") as f:  # a record cut short by a crash
        f.write(suffix_store.MAGIC + suffix_store.HEAD.pack(0, 1000, 0.0) + b"\x01\x00\x00\x00" * 10)
    assert suffix.SuffixDrafter(str(path)).tokens == 0


def test_the_file_keeps_only_the_newest_outputs_within_the_bounds(tmp_path, monkeypatch):
    path = str(tmp_path / "m.bin")
    d = suffix.SuffixDrafter(path)
    outs = [list(range(1000 * i, 1000 * i + 30)) for i in range(1, 6)]
    for i, out in enumerate(outs):
        run(d, i, "", [1], out)
    d.close()
    monkeypatch.setattr(suffix, "MAX_OUTPUTS", 2)
    again = suffix.SuffixDrafter(path)
    assert again.tokens == 60
    again.close()
    assert len(suffix_store.OutputFile(path).load()) == 2  # rewritten with what was kept


def test_a_store_false_lanes_output_drafts_from_memory_and_never_reaches_the_file(tmp_path):
    path = str(tmp_path / "m.bin")
    d = suffix.SuffixDrafter(path)
    private = list(range(500, 530))
    d.begin(0, "key-a", persist=False)  # a store:false request (LaneOpen.persist)
    for t in private:
        d.produced(0, t)
    d.end(0)
    run(d, 1, "key-a", [1], ANSWER)
    d.begin(2, "key-a")
    assert d.propose({2: ([9] + private[:10], 8)})[2] == private[10:18]  # this worker's memory only
    d.close()
    assert [list(t) for _, t, _ in suffix_store.OutputFile(path).load()] == [ANSWER]
    again = suffix.SuffixDrafter(path)
    again.begin(0, "key-a")
    assert again.propose({0: ([9] + private[:10], 8)}) == {}


def test_a_rewrite_leaves_store_false_outputs_out(tmp_path):
    path = str(tmp_path / "m.bin")
    d = suffix.SuffixDrafter(path)
    d.begin(0, "ns", persist=False)
    for t in range(500, 530):
        d.produced(0, t)
    d.end(0)
    d.file.size = 1 << 30  # the next retired lane finds the file grown: it is rewritten from memory
    run(d, 1, "ns", [1], ANSWER)
    d.close()
    assert [list(t) for _, t, _ in suffix_store.OutputFile(path).load()] == [ANSWER]


def test_a_file_written_before_namespaces_crossed_the_link_is_discarded(tmp_path):
    """Version 1 files filed every key's outputs under the shared namespace: none is read."""
    path = tmp_path / "m.bin"
    path.write_bytes(b"SFXOUT1\n" + suffix_store.HEAD.pack(0, len(ANSWER), 0.0)[:6] + array("i", ANSWER).tobytes())
    d = suffix.SuffixDrafter(str(path))
    assert d.tokens == 0
    d.begin(0, "")
    assert d.propose({0: ([5] + ANSWER[:10], 8)}) == {}
    d.close()
    assert path.read_bytes() == suffix_store.MAGIC  # rewritten empty, in this version


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def on_disk(path) -> list[list[int]]:
    return [list(t) for _, t, _ in suffix_store.OutputFile(str(path)).load()]


def raw_tokens_in(path, tokens: list[int]) -> bool:
    """Whether the file's bytes hold these tokens anywhere (not only as a sound record)."""
    return array("i", tokens).tobytes() in path.read_bytes()


def test_an_erasure_removes_earlier_outputs_from_the_file_and_from_memory(tmp_path):
    """Issue 54: a session purged or a retention pass (suffix_store.forget_before) reaches the
    suffix file: before, its outputs stayed on disk whatever was erased."""
    path = tmp_path / "suffix" / "m.bin"
    clock = Clock()
    d = suffix.SuffixDrafter(str(path), clock=clock)
    run(d, 0, "key-a", [1], ANSWER)
    assert raw_tokens_in(path, ANSWER)
    clock.t = 2000.0
    assert suffix_store.forget_before(path.parent, 1500.0) == 1
    assert not raw_tokens_in(path, ANSWER) and on_disk(path) == []  # gone from the disk at once
    later = list(range(300, 330))
    run(d, 1, "key-a", [1], later)  # the worker's next lane sees the erasure: memory lets go too
    d.begin(2, "key-a")
    assert d.propose({2: ([9] + ANSWER[:10], 8)}) == {}
    assert d.propose({2: ([9] + later[:10], 8)})[2] == later[10:18]  # what came after stays
    d.close()
    assert on_disk(path) == [later]
    assert suffix.SuffixDrafter(str(path), clock=clock).tokens == len(later)


def test_a_lane_running_across_an_erasure_never_reaches_the_file(tmp_path):
    path = tmp_path / "m.bin"
    clock = Clock()
    d = suffix.SuffixDrafter(str(path), clock=clock)
    d.begin(0, "ns")
    for t in ANSWER[:20]:
        d.produced(0, t)
    d.propose({0: ([1] + ANSWER[:20], 4)})  # (its first tokens reach the shared tree)
    clock.t = 1001.0
    suffix_store.forget_before(tmp_path, 1000.5)
    for t in ANSWER[20:]:
        d.produced(0, t)
    d.end(0)
    assert on_disk(path) == []
    assert d.tokens == 0 and d.globals == {}


def test_a_rewrite_and_a_new_worker_keep_erased_outputs_out(tmp_path):
    """A worker that compacts its file from memory it has not yet cleared, or starts on a file
    the erasure could not rewrite, still leaves erased outputs out."""
    path = tmp_path / "m.bin"
    clock = Clock()
    d = suffix.SuffixDrafter(str(path), clock=clock)
    run(d, 0, "ns", [1], ANSWER)
    clock.t = 1001.0
    suffix_store.forget_before(tmp_path, 1000.5)
    d.file.size = 1 << 30  # the next retired lane rewrites the file from memory
    d.forgotten = 2e9  # as if this worker had not looked at the erasure yet
    run(d, 1, "ns", [1], [7, 7, 8, 8])
    assert on_disk(path) == [[7, 7, 8, 8]]
    d.close()
    with open(path, "ab") as f:  # an erased record the rewrite could not reach (a copy put back)
        f.write(suffix_store._record("ns", array("i", ANSWER), 999.0))
    assert suffix.SuffixDrafter(str(path), clock=clock).tokens == 4


def test_an_erasure_rewrites_a_file_of_an_older_version(tmp_path):
    path = tmp_path / "m.bin"
    path.write_bytes(b"SFXOUT2\n" + b"\x00\x00" + array("I", [3]).tobytes() + array("i", [5, 6, 7]).tobytes())
    suffix_store.forget_before(tmp_path, 1.0)
    assert path.read_bytes() == suffix_store.MAGIC
