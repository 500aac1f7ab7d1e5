"""Sessions in memory: the fold of recently used sessions (read from the store on a miss)
and one change at a time to a session's turns. Owned by Sessions (service/sessions.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

from ..errors import SessionNotFound
from ..session.events import Event
from ..session.state import SessionState, apply, fold
from ..session.store import SessionRow, Store
from .watchers import Live


class Folds:
    def __init__(self, store: Store, live: Live, *, size: int = 1024):
        self.store = store
        self.live = live  # a generating session's fold stays cached
        self.size = size
        self.states: OrderedDict[str, SessionState] = OrderedDict()
        self.locks: dict[str, list] = {}  # session -> [lock, users]

    async def state(self, sid: str) -> SessionState:
        st = self.states.get(sid)
        if st is None:
            evs = await self.store.events(sid)
            st = fold(sid, evs)
            self.keep(st)
        else:
            self.states.move_to_end(sid)
        if st.purged:
            raise SessionNotFound(f"session {sid} was purged", param="session")
        return st

    def keep(self, st: SessionState) -> None:
        self.states[st.id] = st
        self.states.move_to_end(st.id)
        while len(self.states) > self.size:
            old = next(iter(self.states))
            if self.live.busy(old):
                self.states.move_to_end(old)
                break
            del self.states[old]

    def forget(self, sid: str) -> None:
        self.states.pop(sid, None)

    def applied(self, sid: str, ev: Event) -> None:
        """A committed event on the cached fold (a gap: the fold is read again when needed)."""
        st = self.states.get(sid)
        if st is None:
            return
        if ev.id == st.next_id:
            apply(st, ev)
        elif ev.id > st.next_id:
            del self.states[sid]

    async def row(self, sid: str) -> SessionRow:
        return await self.store.session(sid)

    def in_turn(self, sid: str) -> bool:
        return sid in self.locks

    @contextlib.asynccontextmanager
    async def turn(self, sid: str):
        """Changes to a session's turns (messages, opening a generation, trim) one at a
        time: a span is computed from the context it will follow."""
        entry = self.locks.get(sid)
        if entry is None:
            entry = self.locks[sid] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                self.locks.pop(sid, None)
