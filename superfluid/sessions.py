"""Sessions: the daemon's view of the session log. It opens sessions for API requests and
the native session API, commits every generation's tokens through the store (the engine
calls `commit` once per step), keeps the fold of recently used sessions in memory,
enforces one generation at a time per session, and feeds live subscribers.

A streamed generation outlives its HTTP connection for `grace` seconds, so a client that
lost the connection can resume it (Last-Event-ID); nobody resuming in time cancels it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, fields

from .errors import BadRequest, SessionBusy, SessionNotFound, StoreError, SuperfluidError
from .ids import new_id
from .request import Chunk, FinishReason, GenRequest, Qos, SamplingParams
from .session.events import Body, Event, Generated, Meta, Purge, ToolResult, ToolUse, Trim
from .session.state import SessionState, apply, fold
from .session.store import Append, SessionRow, Store
from .session.turns import Turns

log = logging.getLogger("superfluid.sessions")

SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))
BEHIND = object()  # put on a subscriber's queue instead of the event it could not keep up with


@dataclass(eq=False)
class _Gen:
    sid: str
    req: GenRequest
    engine: object
    next_id: int  # the id the next event of this generation must get
    watchers: int = 0  # HTTP responses streaming it
    timer: asyncio.TimerHandle | None = None
    failed: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Sessions:
    def __init__(self, store: Store, *, grace: float = 10.0, cache_size: int = 1024, max_backlog: int = 4096):
        self.store = store
        self.max_backlog = max_backlog  # events a live reader may leave unread before it is cut loose
        self.grace = grace
        self.cache_size = cache_size
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._gens: dict[str, _Gen] = {}  # by request id
        self._busy: dict[str, _Gen] = {}  # by session id
        self._locks: dict[str, list] = {}  # session -> [lock, users]
        self._subs: dict[str, set[asyncio.Queue]] = {}

    # -- reading -------------------------------------------------------------------------
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

    def live(self, sid: str) -> _Gen | None:
        return self._busy.get(sid)

    @contextlib.asynccontextmanager
    async def _turn(self, sid: str):
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

    # -- applying committed events ------------------------------------------------------
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

    # -- creating ------------------------------------------------------------------------
    async def create(self, engine, *, params: dict, messages: Sequence[dict] = (), title: str | None = None,
                     api: str = "sessions") -> SessionState:
        sid = new_id("sess")
        params = {**params, "model": engine.model_id}
        turns = Turns.of(engine, **template_kwargs(params))
        bodies: list[Body] = [turns.message(m) for m in messages]
        if title is not None:
            bodies.append(Meta(title=title))
        evs = await self.store.create(sid, params=params, model=engine.model_id, api=api, bodies=bodies)
        st = fold(sid, evs)
        self._cache(st)
        return st

    async def open_request(self, engine, reqs: list[GenRequest], bodies: list[Body], *, api: str,
                           params: dict) -> list[AsyncIterator[Chunk]]:
        """An API request's generations as sessions: the first choice's session holds the
        prompt's events; the others fork it after them. Committed, then submitted."""
        for r in reqs:
            engine.check(r)
        specs = []
        first = new_id("sess")
        for i, r in enumerate(reqs):
            p = {**params, "model": engine.model_id, "index": i, "prompt_tokens": len(r.prompt),
                 "sampling": sampling_dict(r.sampling), "max_tokens": r.max_tokens, "stop": list(r.stop)}
            if i == 0:
                specs.append(dict(sid=first, params=p, model=engine.model_id, api=api, bodies=bodies))
            else:
                specs.append(dict(sid=new_id("sess"), params=p, model=engine.model_id, api=api,
                                  parent=first, fork_at=len(bodies)))
        created = await self.store.create_many(specs)
        streams = []
        try:
            for r, spec, evs in zip(reqs, specs, created, strict=True):
                r.session = spec["sid"]
                self._start(r, engine, evs[-1].id + 1)
                streams.append(engine.submit(r))
        except BaseException:
            for r in reqs:
                engine.cancel(r.id)
                self._finish(r.id)
            raise
        return streams

    def _start(self, req: GenRequest, engine, next_id: int) -> _Gen:
        assert req.session is not None
        if req.session in self._busy:
            raise SessionBusy(f"session {req.session} is already generating", param="session")
        gen = _Gen(req.session, req, engine, next_id)
        self._gens[req.id] = gen
        self._busy[req.session] = gen
        return gen

    def _finish(self, rid: str) -> None:
        gen = self._gens.pop(rid, None)
        if gen is None:
            return
        if self._busy.get(gen.sid) is gen:
            del self._busy[gen.sid]
        if gen.timer is not None:
            gen.timer.cancel()
        gen.ended.set()

    # -- verbs of the native API ---------------------------------------------------------
    async def append_message(self, engine, sid: str, msg: dict) -> list[Event]:
        async with self._turn(sid):
            self._idle(sid)
            st = await self.state(sid)
            turns = Turns.of(engine, st, **template_kwargs(st.params))
            body: Body = turns.message(msg)
            if msg.get("role") == "tool":
                body = ToolResult(str(msg.get("tool_call_id") or ""), body.text, body.span)  # type: ignore[union-attr]
            bodies = [body] + [ToolUse(c["function"]["name"], c["function"]["arguments"], c.get("id") or "")
                               for c in msg.get("tool_calls") or ()]
            return await self._append(sid, bodies)

    async def generate(self, engine, sid: str, *, max_tokens: int | None, overrides: dict,
                       stop: tuple[str, ...] | None, qos: Qos) -> tuple[GenRequest, AsyncIterator[Chunk]]:
        """Generate on a session: continue its open turn, or open a new assistant turn."""
        async with self._turn(sid):
            self._idle(sid)
            st = await self.state(sid)
            bodies: list[Body] = []
            prompt = list(st.tokens)
            if not st.turn_open and not st.params.get("raw"):
                opener = Turns.of(engine, st, **template_kwargs(st.params)).opener()
                bodies.append(opener)
                prompt += opener.span
            if not prompt:
                raise BadRequest(f"session {sid} has nothing to generate from: append a message first")
            sp = {**st.params.get("sampling", {}), **overrides}
            room = engine.n_ctx - len(prompt)
            turn = st.turn_tokens if st.turn_open else 0
            req = GenRequest(new_id("gen"), prompt, SamplingParams(**sp),
                             max_tokens if max_tokens is not None else max(1, room),
                             tuple(stop if stop is not None else st.params.get("stop", ())), qos, session=sid,
                             history=tuple(st.tokens[len(st.tokens) - turn:]) if turn else ())
            engine.check(req)
            if bodies:
                await self._append(sid, bodies)
            st = await self.state(sid)
            self._start(req, engine, st.next_id)
            try:
                return req, engine.submit(req)
            except BaseException:
                self._finish(req.id)
                raise

    def _idle(self, sid: str) -> None:
        if sid in self._busy:
            raise SessionBusy(f"session {sid} is generating; wait for it or cancel it", param="session")

    def cancel(self, sid: str) -> bool:
        gen = self._busy.get(sid)
        return gen is not None and gen.engine.cancel(gen.req.id)  # type: ignore[attr-defined]

    async def fork(self, sid: str, at: int | None) -> SessionState:
        st = await self.state(sid)
        at = st.next_id - 1 if at is None else at
        if not 0 <= at < st.next_id:
            raise BadRequest(f"session {sid} has no event {at} (it has {st.next_id})", param="at")
        new = new_id("sess")
        row = await self.row(sid)
        await self.store.create(new, params=st.params, model=row.model, api=row.api, parent=sid, fork_at=at)
        return await self.state(new)

    async def trim(self, sid: str, to: int) -> list[Event]:
        async with self._turn(sid):
            self._idle(sid)
            st = await self.state(sid)
            if not 0 <= to < st.next_id:
                raise BadRequest(f"session {sid} has no event {to} (it has {st.next_id})", param="to")
            return await self._append(sid, [Trim(to)])

    async def set_meta(self, sid: str, title: str | None, archived: bool | None) -> list[Event]:
        await self.state(sid)
        return await self._append(sid, [Meta(title, archived)])

    async def purge(self, sid: str) -> None:
        await self.state(sid)
        self.cancel(sid)
        await self._append(sid, [Purge()])
        self._states.pop(sid, None)

    # -- the engine's side (SessionLog) --------------------------------------------------
    def commit(self, items: list[tuple[GenRequest, Generated]]) -> asyncio.Future:
        """One group commit for a step (the engine's SessionLog side). Which items got an
        append is fixed here, when the ids are handed out, not when the result comes."""
        appends: list[Append] = []
        gens: list[_Gen | None] = []  # None: no append for this item (no session, or it failed before)
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

    async def _committed(self, fut: asyncio.Future, items, gens: list[_Gen | None]) -> list:
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
                    self._finish(req.id)
            else:
                gen.failed = True
                log.error("session %s: commit failed: %s", gen.sid, r)
                self._finish(req.id)
            out.append(r)
        return out

    def end(self, req: GenRequest, finish: FinishReason) -> None:
        gen = self._gens.get(req.id)
        if gen is None:
            return
        if gen.failed:
            self._finish(req.id)
            return
        self.commit([(req, Generated((), "", "content", finish.log_name))])

    # -- watching: resumable streams and subscribers ------------------------------------
    def watch(self, sid: str) -> _Gen | None:
        gen = self._busy.get(sid)
        if gen is not None:
            gen.watchers += 1
            if gen.timer is not None:
                gen.timer.cancel()
                gen.timer = None
        return gen

    def unwatch(self, gen: _Gen | None) -> None:
        """A stream of this generation closed; with nobody left watching, it is cancelled
        after the grace period unless someone resumes it."""
        if gen is None or gen.req.id not in self._gens:
            return
        gen.watchers = max(0, gen.watchers - 1)
        if gen.watchers == 0 and gen.timer is None:
            if self.grace <= 0:
                gen.engine.cancel(gen.req.id)  # type: ignore[attr-defined]
                return
            loop = asyncio.get_running_loop()
            gen.timer = loop.call_later(self.grace, self._abandon, gen)

    def _abandon(self, gen: _Gen) -> None:
        gen.timer = None
        if gen.watchers == 0:
            log.info("session %s: nobody resumed its stream in %.0f s; cancelling", gen.sid, self.grace)
            gen.engine.cancel(gen.req.id)  # type: ignore[attr-defined]

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


def sampling_dict(sp: SamplingParams) -> dict:
    return {k: getattr(sp, k) for k in SAMPLING_FIELDS}


def template_kwargs(params: dict) -> dict:
    kw = dict(params.get("chat_template_kwargs") or {})
    if params.get("tools"):
        kw["tools"] = params["tools"]
    return kw
