"""The native session verbs: create a session, append a message or a tool result, prepare
the next generation on it, fork, trim, title and archive, purge. Spans come from the
model's own chat template (session/turns.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields

from ..codec.channels import ChannelSpec, spec_for, spec_from_wire
from ..errors import BadRequest, SessionBusy
from ..ids import new_id
from ..request import GenRequest, Qos, SamplingParams
from ..session.events import Body, Event, Meta, Purge, ToolResult, ToolUse, Trim
from ..session.state import SessionState, fold
from ..session.store import Store
from ..session.turns import Turns, context_text
from .cache import Folds
from .commits import Commits
from .watchers import Gen, Live

SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


class Verbs:
    """What the native session API (and the web app) does to a session. Owned by Sessions
    (service/sessions.py)."""

    def __init__(self, store: Store, folds: Folds, commits: Commits, live: Live):
        self.store = store
        self.folds = folds
        self.commits = commits
        self.live = live

    async def create(self, engine, *, params: dict, messages: Sequence[dict] = (), title: str | None = None,
                     api: str = "sessions", owner: str | None = None) -> SessionState:
        sid = new_id("sess")
        params = {**params, "model": engine.model_id}
        turns = Turns.of(engine, **template_kwargs(params))
        bodies: list[Body] = [turns.message(m) for m in messages]
        if title is not None:
            bodies.append(Meta(title=title))
        evs = await self.store.create(sid, params=params, model=engine.model_id, api=api, bodies=bodies, owner=owner)
        st = fold(sid, evs)
        self.folds.keep(st)
        return st

    async def append_message(self, engine, sid: str, msg: dict) -> list[Event]:
        async with self.folds.turn(sid):
            self._idle(sid)
            st = await self.folds.state(sid)
            turns = Turns.of(engine, st, **template_kwargs(st.params))
            body: Body = turns.message(msg)
            if msg.get("role") == "tool":
                body = ToolResult(str(msg.get("tool_call_id") or ""), body.text, body.span)  # type: ignore[union-attr]
            bodies = [body] + [ToolUse(c["function"]["name"], c["function"]["arguments"], c.get("id") or "")
                               for c in msg.get("tool_calls") or ()]
            return await self.commits.append(sid, bodies)

    async def next_turn(self, engine, sid: str, *, max_tokens: int | None, overrides: dict,
                        stop: tuple[str, ...] | None, qos: Qos) -> tuple[GenRequest, list[Body]]:
        """The request that generates on a session (continuing its open turn, or opening a
        new assistant turn) and the events to append before it. Call it under turn(sid)."""
        self._idle(sid)
        st = await self.folds.state(sid)
        bodies: list[Body] = []
        prompt = list(st.tokens)
        opener: tuple[int, ...] | None = None
        if not st.turn_open and not st.params.get("raw"):
            gp = Turns.of(engine, st, **template_kwargs(st.params)).opener()
            bodies.append(gp)
            prompt += gp.span
            opener = gp.span
        if not prompt:
            raise BadRequest(f"session {sid} has nothing to generate from: append a message first")
        sp = {**st.params.get("sampling", {}), **overrides}
        room = engine.n_ctx - len(prompt)
        turn = st.turn_tokens if st.turn_open else 0
        req = GenRequest(new_id("gen"), prompt, SamplingParams(**sp),
                         max_tokens if max_tokens is not None else max(1, room),
                         tuple(stop if stop is not None else st.params.get("stop", ())), qos, session=sid,
                         channels=_channels(engine, st, opener),
                         history=tuple(st.tokens[len(st.tokens) - turn:]) if turn else ())
        return req, bodies

    async def begin(self, req: GenRequest, bodies: list[Body], cancel: Callable[[], bool]) -> Gen:
        """Append a turn's opening events and mark the session generating. Under turn(sid)."""
        assert req.session is not None
        if bodies:
            await self.commits.append(req.session, bodies)
        st = await self.folds.state(req.session)
        return self.live.started(req, cancel, st.next_id)

    def _idle(self, sid: str) -> None:
        if self.live.busy(sid):
            raise SessionBusy(f"session {sid} is generating; wait for it or cancel it", param="session")

    async def fork(self, sid: str, at: int | None, owner: str | None = None) -> SessionState:
        st = await self.folds.state(sid)
        at = st.next_id - 1 if at is None else at
        if not 0 <= at < st.next_id:
            raise BadRequest(f"session {sid} has no event {at} (it has {st.next_id})", param="at")
        new = new_id("sess")
        row = await self.folds.row(sid)
        await self.store.create(new, params=st.params, model=row.model, api=row.api, parent=sid, fork_at=at,
                                owner=owner)
        return await self.folds.state(new)

    async def trim(self, sid: str, to: int) -> list[Event]:
        async with self.folds.turn(sid):
            self._idle(sid)
            st = await self.folds.state(sid)
            if not 0 <= to < st.next_id:
                raise BadRequest(f"session {sid} has no event {to} (it has {st.next_id})", param="to")
            return await self.commits.append(sid, [Trim(to)])

    async def set_meta(self, sid: str, title: str | None, archived: bool | None) -> list[Event]:
        await self.folds.state(sid)
        return await self.commits.append(sid, [Meta(title, archived)])

    async def purge(self, sid: str) -> None:
        await self.folds.state(sid)
        self.live.cancel(sid)
        await self.commits.append(sid, [Purge()])
        self.folds.forget(sid)


def _channels(engine, st, opener: tuple[int, ...] | None) -> ChannelSpec | None:
    """How the session's replies are split: as its API request asked, or for a native
    session, the model's reasoning markers and (with tools) its tool format. `opener`: the
    new turn's opener (None: the open turn's, from the log)."""
    if "channels" in st.params or st.params.get("raw"):
        return spec_from_wire(st.params.get("channels"))
    if opener is None:
        e = next((e for e in reversed(st.entries) if e.kind == "generation_prompt"), None)
        opener = tuple(st.tokens[e.start:e.start + e.n]) if e is not None else ()
    text = context_text(engine.tokenizer, list(opener))
    fmt = engine.tool_format
    return spec_for(fmt if st.params.get("tools") or fmt.structured else None, engine.reasoning, text)


def sampling_dict(sp: SamplingParams) -> dict:
    return {k: getattr(sp, k) for k in SAMPLING_FIELDS}


def template_kwargs(params: dict) -> dict:
    kw = dict(params.get("chat_template_kwargs") or {})
    if params.get("tools"):
        kw["tools"] = params["tools"]
    return kw
