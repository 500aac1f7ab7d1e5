"""Sessions: the daemon's view of the session log, by concept in this package: the cache
and fold (cache.py), the commit path (commits.py), watchers and subscribers (watchers.py)
and the native verbs (verbs.py). It never calls an engine: the service (service.py) orders
a request's work, session first, then engine, and hands each generation a way to cancel
itself.

A streamed generation outlives its HTTP connection for `grace` seconds, so a client that
lost the connection can resume it (Last-Event-ID); nobody resuming in time cancels it."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from ..codec.channels import spec_to_wire
from ..errors import SessionBusy
from ..ids import new_id
from ..request import GenRequest
from ..session.events import Body
from ..session.state import SessionState
from ..session.store import Store
from .cache import Cache
from .commits import Commits
from .verbs import Verbs, sampling_dict
from .watchers import Gen, Watchers


class Sessions(Cache, Commits, Watchers, Verbs):
    def __init__(self, store: Store, *, grace: float = 10.0, cache_size: int = 1024, max_backlog: int = 4096):
        self.store = store
        self.max_backlog = max_backlog  # events a live reader may leave unread before it is cut loose
        self.grace = grace
        self.cache_size = cache_size
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._gens: dict[str, Gen] = {}  # by request id
        self._busy: dict[str, Gen] = {}  # by session id
        self._locks: dict[str, list] = {}  # session -> [lock, users]
        self._subs: dict[str, set[asyncio.Queue]] = {}
        self._erasing: set[asyncio.Task] = set()

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

    async def erase_idle(self, sids: list[str], kept: Callable[[str], bool]) -> int:
        """Erase these sessions (retention), but for those generating, in use by a verb, or
        `kept` (pinned); how many were erased."""
        gone = [s for s in sids if s not in self._busy and s not in self._locks and not kept(s)]
        for s in gone:
            self._states.pop(s, None)
        if gone:
            await self.store.erase_many(gone)
        return len(gone)

    def started(self, req: GenRequest, cancel: Callable[[], bool], next_id: int) -> Gen:
        assert req.session is not None
        if req.session in self._busy:
            raise SessionBusy(f"session {req.session} is already generating", param="session")
        gen = Gen(req.session, req, cancel, next_id)
        self._gens[req.id] = gen
        self._busy[req.session] = gen
        return gen

    def finished(self, rid: str) -> None:
        gen = self._gens.pop(rid, None)
        if gen is None:
            return
        if self._busy.get(gen.sid) is gen:
            del self._busy[gen.sid]
        if gen.timer is not None:
            gen.timer.cancel()
        gen.ended.set()
        if gen.ephemeral:  # store: false: nothing of the conversation stays in the log
            self._states.pop(gen.sid, None)
            task = asyncio.get_running_loop().create_task(self.store.erase(gen.sid))
            self._erasing.add(task)
            task.add_done_callback(self._erasing.discard)
