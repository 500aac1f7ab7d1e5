"""Session retention: the store does not fill up.

Idle sessions are erased, least recently written first (their events and stored responses
go; the id stays, answering 404):
- by age: those last written more than `max_age` seconds ago (`--sessions-max-age DAYS`);
- by size, under a cap (`--sessions-max-mb`): once the store's pages are nine tenths of it,
  down to three quarters, so writes keep finding room.

Never a session that is generating, in use by a verb, pinned (`kept`), or that a kept
session was forked from. When only such sessions remain, the store fills and answers the
typed 507 `store_full` until room is freed. A pass that erased sessions also erases the
suffix drafter's kept outputs of lanes opened before the newest of them could have been
written (Sessions.forget_outputs): by age, those older than `max_age`; by size, all of them
(it cannot tell which were the erased sessions'). `once()` is one pass (also
`POST /v1/sessions/prune`, `superfluid sessions prune`); `run()` makes one a minute."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from .sessions import Sessions

log = logging.getLogger("superfluid.retention")

EVERY_S = 60.0
HIGH, LOW = 0.9, 0.75  # a capped store is pruned from HIGH of its cap down to LOW
BATCH = 256  # sessions looked at per query
MAX_ROUNDS = 400  # queries per pass: a pass is bounded, the next one goes on


@dataclass
class Retention:
    sessions: Sessions
    kept: Callable[[str], bool]  # pinned: never erased
    max_age: float | None = None  # seconds
    max_bytes: int | None = None  # the store's cap
    on_erased: Callable[[int], None] = lambda n: None
    clock: Callable[[], float] = time.time  # wall-clock: the store's `updated` times are

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except Exception:  # noqa: BLE001 -- a failed pass (the store stopping) is retried next minute
                log.exception("session retention: a pass failed")
            await asyncio.sleep(EVERY_S)

    async def once(self, *, max_age: float | None = None, max_bytes: int | None = None) -> int:
        """One pass, by the configured policy or the one given; the sessions erased."""
        age = max_age if max_age is not None else self.max_age
        cap = max_bytes if max_bytes is not None else self.max_bytes
        n, forget = 0, None
        if age is not None:
            now = self.clock()
            if k := await self._erase(now - age, lambda: _true()):
                n, forget = k, now - age
        if cap is not None:
            store = self.sessions.store
            high = cap if max_bytes is not None else HIGH * cap  # asked for a size: down to it
            if await store.used_bytes() > high:
                low = cap if max_bytes is not None else LOW * cap
                if k := await self._erase(None, lambda: _over(store, low)):
                    n, forget = n + k, self.clock()
        if forget is not None:
            await self.sessions.forget_outputs(forget)
        if n:
            log.info("session retention: erased %d idle session(s)", n)
            self.on_erased(n)
        return n

    async def _erase(self, cutoff: float | None, more) -> int:
        """Erase candidates while `more()` says so; least recently written first."""
        store, n, skip = self.sessions.store, 0, 0
        for _ in range(MAX_ROUNDS):
            if not await more():
                break
            cands = await store.prunable(cutoff, 16 if cutoff is None else BATCH, skip)
            if not cands:
                break
            k = await self.sessions.erase_idle(cands, self.kept)
            n += k
            skip += len(cands) - k  # the kept ones stay first in line: look past them
        return n


async def _true() -> bool:
    return True


async def _over(store, limit: float) -> bool:
    return await store.used_bytes() > limit
