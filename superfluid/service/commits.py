"""The commit path: a generation's output events reach the store in one group commit per
engine step (the engine's SessionLog side), and the session's cached fold and subscribers
see each event once it is durable."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..errors import StoreError, SuperfluidError
from ..request import FinishReason, GenRequest
from ..session.events import Body, Event, Generated
from ..session.state import SessionState, apply
from ..session.store import Append, Store
from .watchers import BEHIND, Gen

log = logging.getLogger("superfluid.sessions")


class Commits:
    """Mixin of Sessions: appending events and committing generated output."""
    store: Store
    max_backlog: int
    _states: dict[str, SessionState]
    _gens: dict[str, Gen]
    _busy: dict[str, Gen]
    _subs: dict[str, set[asyncio.Queue]]

    if TYPE_CHECKING:  # supplied by the other parts of Sessions
        def unsubscribe(self, sid: str, q: asyncio.Queue) -> None: ...

        def finished(self, rid: str) -> None: ...

    def _applied(self, sid: str, events: list[Event]) -> None:
        st = self._states.get(sid)
        for ev in events:
            if st is not None:
                if ev.id == st.next_id:
                    apply(st, ev)
                elif ev.id > st.next_id:  # we missed some: read it again when needed
                    self._states.pop(sid, None)
                    st = None
            for q in list(self._subs.get(sid, ())):
                if q.qsize() >= self.max_backlog:  # a reader that fell behind: it resumes from the log
                    self.unsubscribe(sid, q)
                    q.put_nowait(BEHIND)
                else:
                    q.put_nowait(ev)

    async def _append(self, sid: str, bodies: list[Body]) -> list[Event]:
        gen = self._busy.get(sid)
        if gen is not None:  # ids are handed out by the running generation (see commit)
            items = [Append(sid, b, expect_id=gen.next_id + i) for i, b in enumerate(bodies)]
            gen.next_id += len(bodies)
        else:
            items = [Append(sid, b) for b in bodies]
        res = await self.store.append(items)
        evs = [r for r in res if isinstance(r, Event)]
        self._applied(sid, evs)
        for r in res:
            if isinstance(r, SuperfluidError):
                raise r
        return evs

    def commit(self, items: list[tuple[GenRequest, Generated]]) -> asyncio.Future:
        """One group commit for a step (the engine's SessionLog side). Which items got an
        append is fixed here, when the ids are handed out, not when the result comes."""
        appends: list[Append] = []
        gens: list[Gen | None] = []  # None: no append for this item (no session, or it failed before)
        for req, body in items:
            gen = self._gens.get(req.id)
            if gen is None or gen.failed:
                gens.append(None)
                continue
            gens.append(gen)
            appends.append(Append(gen.sid, body, expect_id=gen.next_id))
            gen.next_id += 1
        try:
            fut = self.store.append(appends)
        except SuperfluidError as e:  # the store is closed (stopping): every item fails
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(e)
        return asyncio.ensure_future(self._committed(fut, items, gens))

    async def _committed(self, fut: asyncio.Future, items, gens: list[Gen | None]) -> list:
        try:
            res = iter(await fut)
        except SuperfluidError as e:
            res = iter([e] * len(items))
        out: list = []
        for (req, body), gen in zip(items, gens, strict=True):
            if gen is None:
                out.append(StoreError(f"generation {req.id}: no session, or an earlier commit of it failed"))
                continue
            r = next(res)
            if isinstance(r, Event):
                self._applied(gen.sid, [r])
                if body.finish is not None:
                    self.finished(req.id)
            else:
                gen.failed = True
                log.error("session %s: commit failed: %s", gen.sid, r)
                self.finished(req.id)
            out.append(r)
        return out

    def end(self, req: GenRequest, finish: FinishReason) -> None:
        gen = self._gens.get(req.id)
        if gen is None:
            return
        if gen.failed:
            self.finished(req.id)
            return
        if finish == FinishReason.CANCELLED and gen.dropped:
            finish = FinishReason.DROPPED  # a resume continues it from the log
        self.commit([(req, Generated((), "", finish.log_name))])
