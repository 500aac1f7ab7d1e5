"""The SQLite session store: group commit, replay, epochs, refusals, a full disk."""

import asyncio
import os
import sqlite3

import pytest

from superfluid.errors import BadRequest, SessionNotFound, StaleEpoch, StoreError, StoreFull, StoreLocked, \
    StoreUnreadable
from superfluid.session.events import Generated, GenerationPrompt, Message, Meta, Purge
from superfluid.session.state import fold
from superfluid.session.store import Append, Store


def run(coro):
    return asyncio.run(coro)


def call(fn, *args, **kw):
    """Run one store call (writes are queued when called, so inside a loop)."""
    async def go():
        return await fn(*args, **kw)
    return asyncio.run(go())


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "sessions").open()
    yield s
    s.close()


def test_create_append_and_replay_after_reopen(tmp_path):
    d = tmp_path / "sessions"

    async def write():
        s = Store(d).open()
        try:
            await s.create("s1", params={"a": 1}, model="m", api="x", bodies=[Message("user", "hi", (1, 2))])
            await s.append([Append("s1", GenerationPrompt((3,))), Append("s1", Generated((4,), "d"))])
            return s.epoch
        finally:
            s.close()

    e1 = run(write())

    async def read():
        s = Store(d).open()
        try:
            return s.epoch, await s.events("s1"), await s.session("s1")
        finally:
            s.close()

    e2, events, row = run(read())
    assert e2 == e1 + 1
    assert [e.id for e in events] == [0, 1, 2, 3, 4]
    assert events[-1].kind == "epoch_bump"  # it was mid-generation when the store closed
    st = fold("s1", events)
    assert st.tokens == [1, 2, 3, 4] and st.params == {"a": 1} and st.turn_open
    assert row.epoch == e2  # every live session was bumped to the new epoch
    assert row.next_id == 5  # ... and, being mid-generation, got an EpochBump event
    assert row.generating is False


def test_epochs_strictly_increase_over_reopens(tmp_path):
    seen = []
    for _ in range(5):
        s = Store(tmp_path / "s").open()
        seen.append(s.epoch)
        s.close()
    assert seen == sorted(set(seen)) and len(seen) == 5


def test_only_sessions_cut_mid_generation_get_an_epoch_bump_event(tmp_path):
    d = tmp_path / "s"

    async def write():
        s = Store(d).open()
        await s.create("cut", params={}, bodies=[Message("user", "u", (1,)), GenerationPrompt((2,))])
        await s.create("done", params={}, bodies=[Message("user", "u", (1,)), GenerationPrompt((2,))])
        await s.append([Append("done", Generated((3,), "x", finish="end_of_turn"))])
        s.close()

    run(write())
    s = Store(d).open()
    try:
        assert s.recovered == ["cut"]
        kinds = run(_kinds(s, "cut"))
        assert kinds[-1] == "epoch_bump"
        assert run(_kinds(s, "done"))[-1] == "generated"
    finally:
        s.close()


SECRET = "the vault code is 8813-secret-ephemeral"


def test_a_store_false_conversation_cut_by_a_crash_leaves_nothing(tmp_path):
    """A `store: false` session is erased when it ends; one cut by a stop (a crash) is erased
    at the next start, and its text is in neither the database file nor its WAL, nor in the
    free pages (secure_delete). A stored session cut beside it keeps its turn open."""
    d = tmp_path / "s"

    async def write():
        s = Store(d).open()
        await s.create("eph", params={"store": False},
                       bodies=[Message("user", SECRET, (1,)), GenerationPrompt((2,))])
        await s.append([Append("eph", Generated((3,), SECRET.upper(), finish=None))])
        await s.create("kept", params={}, bodies=[Message("user", "u", (1,)), GenerationPrompt((2,))])
        s._w.close()  # the daemon killed: no clean close of the connection (no checkpoint)
        s._w = None
        s._conn = None
        os.close(s._lock_fd)
        s._lock_fd = None

    run(write())
    files = lambda: b"".join(p.read_bytes() for p in d.iterdir() if p.is_file())  # noqa: E731
    assert SECRET.encode() in files()  # as written before the crash
    s = Store(d).open()
    try:
        assert s.recovered == ["kept"]
        with pytest.raises(SessionNotFound):
            run(s.events("eph"))
        assert run(_kinds(s, "kept"))[-1] == "epoch_bump"
        blob = files()
        assert SECRET.encode() not in blob and SECRET.upper().encode() not in blob
    finally:
        s.close()


async def _kinds(s, sid):
    return [e.kind for e in await s.events(sid)]


def test_concurrent_appends_share_a_commit(store):
    async def go():
        await store.create("s", params={})
        before = store.commits
        futs = [store.append([Append("s", Generated((i,), str(i)))]) for i in range(50)]
        res = await asyncio.gather(*futs)
        return before, res

    before, res = run(go())
    assert [r[0].id for r in res] == list(range(1, 51))  # dense, in call order
    assert store.commits - before <= 5  # 50 appends, a handful of transactions


def test_refused_items_do_not_stop_the_others(store):
    async def go():
        await store.create("s", params={})
        return await store.append([Append("nope", Meta("x")), Append("s", Meta("t")),
                                   Append("s", Meta("u"), epoch=store.epoch + 7),
                                   Append("s", Meta("v"), expect_id=99)])

    r = run(go())
    assert isinstance(r[0], SessionNotFound)
    assert r[1].id == 1
    assert isinstance(r[2], StaleEpoch)
    assert isinstance(r[3], StoreError)
    assert [e.id for e in run(store.events("s"))] == [0, 1]


def test_fork_shares_the_parent_prefix(store):
    async def go():
        await store.create("p", params={"k": 1}, bodies=[Message("user", "a", (1,)), Message("user", "b", (2,))])
        await store.create("f", params={"k": 1}, parent="p", fork_at=1)
        await store.append([Append("f", Message("user", "c", (3,)))])
        await store.append([Append("p", Message("user", "d", (4,)))])
        return await store.events("f"), await store.events("p"), await store.events("f", after=1)

    f, p, tail = run(go())
    assert [e.id for e in f] == [0, 1, 2, 3]
    assert fold("f", f).tokens == [1, 3]
    assert fold("p", p).tokens == [1, 2, 4]  # the parent is never rewritten
    assert [e.id for e in tail] == [2, 3]
    with pytest.raises(BadRequest):
        call(store.create, "g", params={}, parent="p", fork_at=99)
    with pytest.raises(SessionNotFound):
        run(store.events("nope"))
    assert run(store.events("p", after=100)) == []


def test_purged_sessions_refuse_appends_and_leave_lists(store):
    async def go():
        await store.create("s", params={})
        await store.append_one(Append("s", Purge()))
        return await store.append([Append("s", Meta("x"))]), await store.sessions()

    res, rows = run(go())
    assert isinstance(res[0], SessionNotFound)
    assert rows == []


def test_a_second_owner_is_refused(tmp_path, store):
    with pytest.raises(StoreLocked) as e:
        Store(store.dir).open()
    assert str(store.dir) in e.value.message


def test_a_file_that_is_not_a_store_is_refused_and_left_untouched(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    junk = b"this is not sqlite at all" * 100
    (d / "sessions.db").write_bytes(junk)
    with pytest.raises(StoreUnreadable) as e:
        Store(d).open()
    assert "sessions.db" in e.value.message
    assert (d / "sessions.db").read_bytes() == junk
    other = tmp_path / "o"
    other.mkdir()
    con = sqlite3.connect(other / "sessions.db")
    con.execute("CREATE TABLE x (y)")
    con.commit()
    con.close()
    with pytest.raises(StoreUnreadable):
        Store(other).open()  # a real SQLite file, but not ours


def test_a_full_disk_fails_the_commit_and_keeps_the_store_consistent(tmp_path):
    d = tmp_path / "s"
    s = Store(d, max_bytes=64 * 1024).open()
    big = tuple(range(2000))

    async def fill():
        await s.create("s", params={})
        ok, err = 0, None
        for _ in range(200):
            try:
                await s.append_one(Append("s", Message("user", "x" * 2000, big)))
                ok += 1
            except StoreError as e:
                err = e
                break
        return ok, err

    ok, err = run(fill())
    assert isinstance(err, StoreFull) and err.status == 507 and "full" in err.message  # typed, not a 500
    events = run(s.events("s"))
    assert [e.id for e in events] == list(range(ok + 1))  # everything acknowledged, nothing half-written
    s.close()
    s = Store(d).open()  # and it opens again, whole
    try:
        assert len(run(s.events("s"))) == ok + 1
    finally:
        s.close()


def test_throwaway_store(tmp_path):
    s = Store(None).open()
    try:
        call(s.create, "s", params={})
        assert len(run(s.events("s"))) == 1
        assert not s.durable
    finally:
        s.close()


def test_a_subscriber_that_falls_behind_is_cut_loose_not_buffered_forever(tmp_path):
    from superfluid.service import BEHIND, Sessions

    async def go():
        s = Store(None).open()
        try:
            sessions = Sessions(s, max_backlog=5)
            await s.create("x", params={})
            q = sessions.subscribe("x")
            await sessions.commits.append("x", [Meta(f"t{i}") for i in range(12)])
            got = [q.get_nowait() for _ in range(q.qsize())]
            return got, "x" in sessions.live.subs
        finally:
            s.close()

    got, still = run(go())
    assert len(got) == 6 and got[-1] is BEHIND and not still


def test_one_bad_write_fails_alone_in_its_batch():
    """A body nested past the recursion limit (deep `tools` in a session's params) fails its
    own write only, never rolling the whole group commit back with every other session's
    tokens in it."""
    deep: dict = {}
    cur = deep
    for _ in range(5000):
        cur["x"] = {}
        cur = cur["x"]

    async def go():
        s = Store(None).open()
        try:
            await s.create("ok", params={})
            futs = [s.create("bad", params={"tools": deep}), s.append([Append("ok", Meta("fine"))])]
            res = await asyncio.gather(*futs, return_exceptions=True)
            return res, [e.kind for e in await s.events("ok")]
        finally:
            s.close()

    (bad, good), kinds = run(go())
    assert isinstance(bad, StoreError) and "encode" in bad.message
    assert not isinstance(good[0], Exception) and kinds == ["created", "meta"]
