"""The commit path: a generation's output events reach the store in one group commit per
engine step (the engine's SessionLog side), and the session's cached fold and subscribers
see each event once it is durable."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..errors import StoreError, SuperfluidError
from ..request import FinishReason, GenRequest
from ..session.events import Body, Event, Generated
from ..session.store import Append, Store
from .cache import Folds
from .watchers import Gen, Live

log = logging.getLogger("superfluid.sessions")


class Commits:
    """Owned by Sessions (service/sessions.py): `finished` is its end of a generation."""

    def __init__(self, store: Store, folds: Folds, live: Live, finished: Callable[[str], None]):
        self.store = store
        self.folds = folds
        self.live = live
        self.finished = finished

    def applied(self, sid: str, events: list[Event]) -> None:
        """Committed events: on the session's cached fold, then to its subscribers."""
        for ev in events:
            self.folds.applied(sid, ev)
            self.live.publish(sid, ev)

    async def append(self, sid: str, bodies: list[Body]) -> list[Event]:
        gen = self.live.running(sid)
        if gen is not None:  # ids are handed out by the running generation (see commit)
            items = [Append(sid, b, expect_id=gen.next_id + i) for i, b in enumerate(bodies)]
            gen.next_id += len(bodies)
        else:
            items = [Append(sid, b) for b in bodies]
        res = await self.store.append(items)
        evs = [r for r in res if isinstance(r, Event)]
        self.applied(sid, evs)
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
            gen = self.live.gens.get(req.id)
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
                self.applied(gen.sid, [r])
                if body.finish is not None:
                    self.finished(req.id)
            else:
                gen.failed = True
                log.error("session %s: commit failed: %s", gen.sid, r)
                self.finished(req.id)
            out.append(r)
        return out

    def end(self, req: GenRequest, finish: FinishReason) -> None:
        gen = self.live.gens.get(req.id)
        if gen is None:
            return
        if gen.failed:
            self.finished(req.id)
            return
        if finish == FinishReason.CANCELLED and gen.dropped:
            finish = FinishReason.DROPPED  # a resume continues it from the log
        self.commit([(req, Generated((), "", finish.log_name))])
