"""The generations running on sessions, and who follows them: the HTTP streams watching a
generation (one whose watchers all went away is cut after the resume grace, unless a client
resumes it with Last-Event-ID) and the subscribers that get every event as it commits.

The grace is read on the daemon's clock (daemon.build's `clock`): a timer fires when it
should have run out and cuts only if the clock agrees, and `expire()` cuts every
generation whose grace has run out, so a test advances the clock instead of sleeping."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import SessionBusy
from ..request import GenRequest
from ..session.events import Event

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
    deadline: float | None = None  # on the clock: nobody watching, it is cut then
    failed: bool = False
    dropped: bool = False  # cancelled because nobody was reading it any more
    ephemeral: bool = False  # store: false: its session's content is erased once it ends
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Live:
    """Which sessions are generating (by request id and by session), their watchers and
    the sessions' subscribers. Owned by Sessions (service/sessions.py)."""

    def __init__(self, *, grace: float, max_backlog: int, clock: Callable[[], float] = time.monotonic):
        self.grace = grace
        self.max_backlog = max_backlog  # events a live reader may leave unread before it is cut loose
        self.clock = clock
        self.gens: dict[str, Gen] = {}  # by request id
        self.by_session: dict[str, Gen] = {}
        self.subs: dict[str, set[asyncio.Queue]] = {}

    # -- generations ---------------------------------------------------------------------
    def busy(self, sid: str) -> bool:
        return sid in self.by_session

    def running(self, sid: str) -> Gen | None:
        return self.by_session.get(sid)

    def started(self, req: GenRequest, cancel: Callable[[], bool], next_id: int) -> Gen:
        assert req.session is not None
        if req.session in self.by_session:
            raise SessionBusy(f"session {req.session} is already generating", param="session")
        gen = Gen(req.session, req, cancel, next_id)
        self.gens[req.id] = gen
        self.by_session[req.session] = gen
        return gen

    def ended(self, rid: str) -> Gen | None:
        """The generation `rid` ended: forgotten, its waiters woken; it (None: unknown)."""
        gen = self.gens.pop(rid, None)
        if gen is None:
            return None
        if self.by_session.get(gen.sid) is gen:
            del self.by_session[gen.sid]
        if gen.timer is not None:
            gen.timer.cancel()
        gen.ended.set()
        return gen

    def cancel(self, sid: str) -> bool:
        gen = self.by_session.get(sid)
        return gen is not None and gen.cancel()

    # -- watchers ------------------------------------------------------------------------
    def watch(self, sid: str) -> Gen | None:
        gen = self.by_session.get(sid)
        if gen is not None:
            gen.watchers += 1
            gen.deadline = None
            if gen.timer is not None:
                gen.timer.cancel()
                gen.timer = None
        return gen

    def unwatch(self, gen: Gen | None) -> None:
        """A stream of this generation closed. With nobody left watching it is cut at once
        (finish "dropped": its lane is free for others, its KV stays cached, and a resume
        continues it from the log), or with --resume-grace S only after S seconds."""
        if gen is None or gen.req.id not in self.gens:
            return
        gen.watchers = max(0, gen.watchers - 1)
        if gen.watchers == 0 and gen.deadline is None:
            if self.grace <= 0:
                self._drop(gen)
                return
            gen.deadline = self.clock() + self.grace
            gen.timer = asyncio.get_running_loop().call_later(self.grace, self._due, gen)

    def _due(self, gen: Gen) -> None:
        gen.timer = None
        if gen.deadline is None or gen.req.id not in self.gens:
            return
        left = gen.deadline - self.clock()
        if left > 0:  # a clock that is not the loop's: look again when it says the grace is over
            gen.timer = asyncio.get_running_loop().call_later(left, self._due, gen)
            return
        self._drop(gen)

    def expire(self) -> int:
        """Cut every unwatched generation whose grace has run out on the clock; how many."""
        now = self.clock()
        due = [g for g in self.gens.values() if g.deadline is not None and g.deadline <= now]
        for gen in due:
            if gen.timer is not None:
                gen.timer.cancel()
                gen.timer = None
            self._drop(gen)
        return len(due)

    def _drop(self, gen: Gen) -> None:
        if self.grace > 0:
            log.info("session %s: nobody resumed its stream in %.0f s; cancelling", gen.sid, self.grace)
        gen.deadline = None
        gen.dropped = True
        gen.cancel()

    # -- subscribers ---------------------------------------------------------------------
    def subscribe(self, sid: str) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.subs.setdefault(sid, set()).add(q)
        return q

    def unsubscribe(self, sid: str, q: asyncio.Queue) -> None:
        subs = self.subs.get(sid)
        if subs is not None:
            subs.discard(q)
            if not subs:
                del self.subs[sid]

    def publish(self, sid: str, ev: Event) -> None:
        """A committed event to the session's subscribers; a reader that fell behind is cut
        loose (BEHIND) and resumes from the log."""
        for q in list(self.subs.get(sid, ())):
            if q.qsize() >= self.max_backlog:
                self.unsubscribe(sid, q)
                q.put_nowait(BEHIND)
            else:
                q.put_nowait(ev)
