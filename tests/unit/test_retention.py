"""Session retention (service/retention.py) on a real store: by age and by size, least
recently written first, never a generating, pinned or forked-from session; a full store's
507 goes once retention frees room."""

import asyncio

from superfluid.errors import SessionNotFound, StoreFull
from superfluid.service.retention import Retention
from superfluid.service.sessions import Sessions
from superfluid.session.events import Generated, GenerationPrompt, Message
from superfluid.session.store import Append, Store

DAY = 86400.0


async def turn(store: Store, sid: str, *, done: bool = True, size: int = 10, parent: str | None = None) -> None:
    if parent is not None:
        await store.create(sid, params={}, parent=parent, fork_at=0)
        return
    await store.create(sid, params={}, bodies=[Message("user", "x" * size, (1,) * size), GenerationPrompt((2,))])
    if done:
        await store.append([Append(sid, Generated((3,), "ok", finish="end_of_turn"))])


async def alive(store: Store, sid: str) -> bool:
    try:
        await store.events(sid)
        return True
    except SessionNotFound:
        return False


def test_age_erases_idle_sessions_but_never_live_pinned_or_forked_from(tmp_path):
    async def go():
        store = Store(tmp_path / "s").open()
        try:
            for sid in ("old", "pinned", "parent"):
                await turn(store, sid)
            await turn(store, "live", done=False)  # generating
            await turn(store, "fork", parent="parent")
            sessions = Sessions(store)
            erased: list[int] = []
            r = Retention(sessions, kept=lambda sid: sid in ("pinned", "fork"), max_age=7 * DAY,
                          on_erased=erased.append, clock=lambda: 0.0)
            assert await r.once() == 0  # nothing is a week old yet
            import time
            r.clock = lambda: time.time() + 8 * DAY
            assert await r.once() == 1 and erased == [1]
            assert [await alive(store, s) for s in ("old", "pinned", "parent", "live", "fork")] == \
                [False, True, True, True, True]
            r.kept = lambda sid: sid == "pinned"  # the fork is let go: then its parent goes too
            assert await r.once() == 2
            assert not await alive(store, "fork") and not await alive(store, "parent")
        finally:
            store.close()

    asyncio.run(go())


def test_a_capped_store_is_pruned_oldest_first_and_a_full_one_takes_writes_again(tmp_path):
    async def go():
        cap = 256 * 1024
        store = Store(tmp_path / "s", max_bytes=cap).open()
        try:
            n, full = 0, None
            while full is None:  # fill it to the cap: then a write is a typed 507
                try:
                    await turn(store, f"s{n:04d}", size=2000)
                    n += 1
                except StoreFull as e:
                    full = e
            sessions = Sessions(store)
            r = Retention(sessions, kept=lambda sid: sid == "s0000", max_bytes=cap)
            erased = await r.once()
            assert erased > 0
            assert await store.used_bytes() <= 0.75 * cap
            assert await alive(store, "s0000")  # pinned, though the oldest
            assert not await alive(store, "s0001")  # the oldest others went first
            assert await alive(store, f"s{n - 1:04d}")  # the newest stayed
            await turn(store, "after", size=2000)  # room again
            assert await r.once() == 0  # under nine tenths: nothing to do
        finally:
            store.close()

    asyncio.run(go())


def test_a_pass_that_erases_reaches_the_suffix_files_by_age_or_all_by_size(tmp_path):
    """Issue 54: retention erased sessions but not their outputs kept by the suffix drafter:
    a pass that erases now tells Sessions.forget_outputs from when (runtime/suffix_store.py)."""
    async def go():
        store = Store(tmp_path / "s").open()
        try:
            await turn(store, "old")
            sessions = Sessions(store)
            told: list[float] = []

            async def forget(cutoff: float) -> None:
                told.append(cutoff)
            sessions.forget_outputs = forget
            import time
            now = time.time() + 8 * DAY
            r = Retention(sessions, kept=lambda sid: False, max_age=7 * DAY, clock=lambda: now)
            assert await r.once() == 1 and told == [now - 7 * DAY]
            assert await r.once() == 0 and told == [now - 7 * DAY]  # nothing erased: nothing to reach
            await turn(store, "big", size=4000)
            r.max_age = None
            assert await r.once(max_bytes=1) == 1 and told[-1] == now  # by size: every earlier output
            await turn(store, "purged")
            await sessions.purge("purged")
            assert len(told) == 3 and told[-1] <= time.time()
        finally:
            store.close()

    asyncio.run(go())
