"""Sessions in memory: the fold of recently used sessions (read from the store on a miss),
which sessions are generating, and one change at a time to a session's turns."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

from ..errors import SessionNotFound
from ..session.state import SessionState, fold
from ..session.store import SessionRow, Store
from .watchers import Gen


class Cache:
    """Mixin of Sessions: reading sessions."""
    store: Store
    cache_size: int
    _states: OrderedDict[str, SessionState]
    _busy: dict[str, Gen]
    _locks: dict[str, list]

    async def state(self, sid: str) -> SessionState:
        st = self._states.get(sid)
        if st is None:
            evs = await self.store.events(sid)
            st = fold(sid, evs)
            self._cache(st)
        else:
            self._states.move_to_end(sid)
        if st.purged:
            raise SessionNotFound(f"session {sid} was purged", param="session")
        return st

    def _cache(self, st: SessionState) -> None:
        self._states[st.id] = st
        self._states.move_to_end(st.id)
        while len(self._states) > self.cache_size:
            old = next(iter(self._states))
            if old in self._busy:
                self._states.move_to_end(old)
                break
            del self._states[old]

    async def row(self, sid: str) -> SessionRow:
        return await self.store.session(sid)

    def busy(self, sid: str) -> bool:
        return sid in self._busy

    def live(self, sid: str) -> Gen | None:
        return self._busy.get(sid)

    @contextlib.asynccontextmanager
    async def turn(self, sid: str):
        """Changes to a session's turns (messages, opening a generation, trim) one at a
        time: a span is computed from the context it will follow."""
        entry = self._locks.get(sid)
        if entry is None:
            entry = self._locks[sid] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                self._locks.pop(sid, None)
