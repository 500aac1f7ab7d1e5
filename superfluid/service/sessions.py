"""Sessions: the daemon's view of the session log, composed of parts owned by concept: the
cached folds (cache.py), the commit path (commits.py), live generations, their watchers and
subscribers (watchers.py) and the native verbs (verbs.py). It never calls an engine: the service (service.py) orders
a request's work, session first, then engine, and hands each generation a way to cancel
itself.

A streamed generation outlives its HTTP connection for `grace` seconds, so a client that
lost the connection can resume it (Last-Event-ID); nobody resuming in time cancels it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ..codec.channels import spec_to_wire
from ..ids import new_id
from ..request import GenRequest
from ..session.events import Body
from ..session.store import Store
from .cache import Folds
from .commits import Commits
from .verbs import Verbs, sampling_dict
from .watchers import Gen, Live


class Sessions:
    """The session log's daemon side, composed of its owned parts: `live` (generations,
    watchers, subscribers), `folds` (cached state, one turn at a time), `commits` (the
    commit path) and `verbs` (the native API). Their public calls are this object's."""

    def __init__(self, store: Store, *, grace: float = 10.0, cache_size: int = 1024, max_backlog: int = 4096,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.live = live = Live(grace=grace, max_backlog=max_backlog, clock=clock)
        self.folds = folds = Folds(store, live, size=cache_size)
        self.commits = commits = Commits(store, folds, live, self.finished)
        self.verbs = verbs = Verbs(store, folds, commits, live)
        self._erasing: set[asyncio.Task] = set()
        # what else an erasure reaches: given a wall-clock time, the generations' leftovers of
        # every lane opened before it (the suffix drafter's files: daemon.build wires it)
        self.forget_outputs: Callable[[float], Awaitable[object]] = _nothing
        # reading
        self.state, self.row, self.turn = folds.state, folds.row, folds.turn
        self.busy, self.watch, self.unwatch, self.expire = live.busy, live.watch, live.unwatch, live.expire
        self.subscribe, self.unsubscribe, self.cancel = live.subscribe, live.unsubscribe, live.cancel
        # the engine's SessionLog side
        self.commit, self.end = commits.commit, commits.end
        # the native verbs
        self.create, self.append_message, self.next_turn = verbs.create, verbs.append_message, verbs.next_turn
        self.begin, self.fork, self.trim = verbs.begin, verbs.fork, verbs.trim
        self.set_meta = verbs.set_meta

    async def open_requests(self, model: str, reqs: list[GenRequest], bodies: list[Body], *, api: str,
                            params: dict, cancel: Callable[[GenRequest], Callable[[], bool]],
                            owner: str | None = None) -> None:
        """An API request's generations as sessions, committed: the first choice's session
        holds the prompt's events; the others fork it after them. Each request gets its
        session id and is marked generating."""
        specs: list[dict] = []
        first = new_id("sess")
        for i, r in enumerate(reqs):
            p = {**params, "model": model, "index": i, "prompt_tokens": len(r.prompt),
                 "sampling": sampling_dict(r.sampling), "max_tokens": r.max_tokens, "stop": list(r.stop),
                 "channels": spec_to_wire(r.channels)}
            if i == 0:
                specs.append(dict(sid=first, params=p, model=model, api=api, bodies=bodies, owner=owner))
            else:
                specs.append(dict(sid=new_id("sess"), params=p, model=model, api=api, parent=first,
                                  fork_at=len(bodies), owner=owner))
        created = await self.store.create_many(specs)
        for r, spec, evs in zip(reqs, specs, created, strict=True):
            r.session = spec["sid"]
            self.started(r, cancel(r), evs[-1].id + 1).ephemeral = params.get("store") is False

    async def purge(self, sid: str) -> None:
        """A session erased for good (DELETE /v1/sessions/ID), and with it every kept output of
        a lane opened before now: the suffix drafter cannot tell which were this session's."""
        await self.verbs.purge(sid)
        await self.forget_outputs(time.time())

    async def erase_idle(self, sids: list[str], kept: Callable[[str], bool]) -> int:
        """Erase these sessions (retention), but for those generating, in use by a verb, or
        `kept` (pinned); how many were erased."""
        gone = [s for s in sids if not self.live.busy(s) and not self.folds.in_turn(s) and not kept(s)]
        for s in gone:
            self.folds.forget(s)
        if gone:
            await self.store.erase_many(gone)
        return len(gone)

    def started(self, req: GenRequest, cancel: Callable[[], bool], next_id: int) -> Gen:
        return self.live.started(req, cancel, next_id)

    def finished(self, rid: str) -> None:
        gen = self.live.ended(rid)
        if gen is not None and gen.ephemeral:  # store: false: nothing of the conversation stays in the log
            self.folds.forget(gen.sid)
            task = asyncio.get_running_loop().create_task(self.store.erase(gen.sid))
            self._erasing.add(task)
            task.add_done_callback(self._erasing.discard)


async def _nothing(cutoff: float) -> None:
    return None
