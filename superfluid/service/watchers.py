"""Who is following a session's generation: the HTTP streams watching it (a generation
whose watchers all went away is cancelled after the grace period, unless a client resumes
it with Last-Event-ID) and the subscribers that get every event as it commits."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..request import GenRequest

log = logging.getLogger("superfluid.sessions")

BEHIND = object()  # put on a subscriber's queue instead of the event it could not keep up with


@dataclass(eq=False)
class Gen:
    """A running generation on a session."""
    sid: str
    req: GenRequest
    cancel: Callable[[], bool]  # stops it in whatever engine runs it (the service supplies this)
    next_id: int  # the id the next event of this generation must get
    watchers: int = 0  # HTTP responses streaming it
    timer: asyncio.TimerHandle | None = None
    failed: bool = False
    dropped: bool = False  # cancelled because nobody was reading it any more
    ephemeral: bool = False  # store: false: its session's content is erased once it ends
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Watchers:
    """Mixin of Sessions: watching generations and subscribing to sessions."""
    grace: float
    _gens: dict[str, Gen]
    _busy: dict[str, Gen]
    _subs: dict[str, set[asyncio.Queue]]

    def watch(self, sid: str) -> Gen | None:
        gen = self._busy.get(sid)
        if gen is not None:
            gen.watchers += 1
            if gen.timer is not None:
                gen.timer.cancel()
                gen.timer = None
        return gen

    def unwatch(self, gen: Gen | None) -> None:
        """A stream of this generation closed. With nobody left watching it is cut at once
        (finish "dropped": its lane is free for others, its KV stays cached, and a resume
        continues it from the log), or with --resume-grace S only after S seconds."""
        if gen is None or gen.req.id not in self._gens:
            return
        gen.watchers = max(0, gen.watchers - 1)
        if gen.watchers == 0 and gen.timer is None:
            if self.grace <= 0:
                gen.dropped = True
                gen.cancel()
                return
            loop = asyncio.get_running_loop()
            gen.timer = loop.call_later(self.grace, self._abandon, gen)

    def _abandon(self, gen: Gen) -> None:
        gen.timer = None
        if gen.watchers == 0:
            log.info("session %s: nobody resumed its stream in %.0f s; cancelling", gen.sid, self.grace)
            gen.dropped = True
            gen.cancel()

    def subscribe(self, sid: str) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self._subs.setdefault(sid, set()).add(q)
        return q

    def unsubscribe(self, sid: str, q: asyncio.Queue) -> None:
        subs = self._subs.get(sid)
        if subs is not None:
            subs.discard(q)
            if not subs:
                del self._subs[sid]
