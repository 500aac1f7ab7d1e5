"""The native session API under /v1/sessions: create, append messages and tool results,
generate (SSE), cancel, read events, subscribe, resume a dropped stream, list, inspect,
fork, trim, title/archive, purge, and pin/unpin (the session's context stays warm in a KV
slot and on disk). Translation only: the work is in sessions.Sessions and the engine."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from ..errors import BadRequest, SessionNotFound
from ..limits import arguments_text
from ..request import SamplingParams
from ..service.registry import LOADS_REFUSED
from ..service.verbs import sampling_dict
from . import cache_ns
from .policy import listed_owner, may_see, owner_of
from .resume import media_type, rest_of_generation, subscription
from .schema import (SessionCreate, SessionFork, SessionGenerate, SessionMessage, SessionMetaBody, SessionToolResult,
                     SessionTrim, parse)
from .sse import DONE, cursor, event, parse_cursor
from .runner import Run
from .streams import SSE_HEADERS


def _json(obj, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _int_query(request: Request, name: str, default: int | None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer", param=name) from None


def _cursor(request: Request, sid: str) -> tuple[int, int | None]:
    """Where to read on: Last-Event-ID ("session:event", or "session:event.k" when the client
    saw only frames 0..k of that event's chunk) or ?after=N."""
    c = parse_cursor(request.headers.get("last-event-id"))
    if c is not None:
        if c[0] != sid:
            raise BadRequest(f"Last-Event-ID {c[0]}:{c[1]} belongs to another session", param="Last-Event-ID")
        return c[1], c[2]
    return _int_query(request, "after", -1), None  # type: ignore[return-value]


def _after(request: Request, sid: str) -> int:
    """The last event read in full (an event only partly seen is read again)."""
    after, frame = _cursor(request, sid)
    return after if frame is None else after - 1


def add_routes(app: FastAPI, models, qos_for) -> None:
    sessions = models.sessions

    async def check_owner(request: Request, sid: str) -> None:
        """Keys own their sessions: another key's is not found (an admin key sees all)."""
        if not may_see(request, (await sessions.row(sid)).owner):
            raise SessionNotFound(f"no session {sid}", param="session")

    owned = APIRouter(dependencies=[Depends(check_owner)])  # every /v1/sessions/{sid} route

    async def summary(sid: str) -> dict:
        st = await sessions.state(sid)
        row = await sessions.row(sid)
        return {**row.to_json(), "title": st.title, "archived": st.archived, "tokens": len(st.tokens),
                "turn_open": st.turn_open, "last_finish": st.last_finish, "busy": sessions.busy(sid),
                "params": cache_ns.shown(st.params)}

    async def engine_of(sid: str):
        st = await sessions.state(sid)
        return await models.get(st.params.get("model"))

    @app.post("/v1/sessions")
    async def create(request: Request):
        body = parse(SessionCreate, await request.body())
        eng = await models.get(body.model)
        sp = {**sampling_dict(SamplingParams()), **eng.sampling_defaults, **body.overrides()}
        if body.seed is None:
            sp["seed"] = eng.new_seed()
        params = {"sampling": sp, "stop": list(body.stops() or ()), "raw": body.raw}
        if body.tools:
            params["tools"] = body.tools
        msgs = [{"role": "prompt" if body.raw else "system", "content": body.system}] if body.system else []
        st = await sessions.create(eng, params=params, messages=msgs, title=body.title, owner=owner_of(request))
        return _json(await summary(st.id), 201)

    @app.get("/v1/sessions")
    async def list_sessions(request: Request):
        limit = _int_query(request, "limit", 100)
        if not limit or not 1 <= limit <= 1000:
            raise BadRequest("limit must be between 1 and 1000", param="limit")
        archived = request.query_params.get("archived")
        before = request.query_params.get("before")
        try:
            rows = await sessions.store.sessions(limit=limit, before=float(before) if before else None,
                                                 archived=None if archived is None else archived == "true",
                                                 owner=listed_owner(request))
        except ValueError:
            raise BadRequest("before must be a timestamp", param="before") from None
        return _json({"object": "list", "data": [r.to_json() for r in rows]})

    @owned.get("/v1/sessions/{sid}")
    async def inspect(sid: str):
        return _json(await summary(sid))

    @owned.patch("/v1/sessions/{sid}")
    async def set_meta(sid: str, request: Request):
        body = parse(SessionMetaBody, await request.body())
        await sessions.set_meta(sid, body.title, body.archived)
        return _json(await summary(sid))

    @owned.delete("/v1/sessions/{sid}")
    async def purge(sid: str):
        await sessions.purge(sid)
        return _json({"id": sid, "object": "session", "deleted": True})

    @owned.post("/v1/sessions/{sid}/messages")
    async def append_message(sid: str, request: Request):
        body = parse(SessionMessage, await request.body())
        role = "system" if body.role == "developer" else body.role
        st = await sessions.state(sid)
        msg: dict = {"role": "prompt" if st.params.get("raw") else role, "content": body.content}
        if body.tool_calls:
            if role != "assistant":
                raise BadRequest("only an assistant message has tool_calls", param="tool_calls")
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": arguments_text(c.function.arguments, "tool_calls")}}
                for c in body.tool_calls]
        evs = await sessions.append_message(await engine_of(sid), sid, msg)
        return _json({"object": "list", "data": [e.to_json(sid) for e in evs]})

    @owned.post("/v1/sessions/{sid}/tool_results")
    async def append_tool_result(sid: str, request: Request):
        body = parse(SessionToolResult, await request.body())
        evs = await sessions.append_message(await engine_of(sid), sid,
                                            {"role": "tool", "content": body.content, "tool_call_id": body.call_id})
        return _json({"object": "list", "data": [e.to_json(sid) for e in evs]})

    @owned.post("/v1/sessions/{sid}/generate")
    async def generate(sid: str, request: Request):
        body = parse(SessionGenerate, await request.body())
        eng = await engine_of(sid)
        run = await Run.generate(request, models.service, eng, sid, max_tokens=body.max_tokens,
                                 overrides=body.overrides(), stop=body.stops(), qos=qos_for(request))
        if body.stream:
            return run.stream(_generated(sid, run.streams[0]))
        c = (await run.collect())[0]
        return _json({"object": "session.generation", "session": sid, "text": "".join(c.text),
                      "finish": c.finish.log_name if c.finish else None,
                      "last_event_id": c.last.event_id if c.last else None,
                      "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                                "cached_tokens": c.cached_tokens}})

    @owned.post("/v1/sessions/{sid}/cancel")
    async def cancel(sid: str):
        await sessions.state(sid)
        return _json({"session": sid, "cancelled": sessions.cancel(sid)})

    @owned.get("/v1/sessions/{sid}/events")
    async def events(sid: str, request: Request):
        after = _after(request, sid)
        limit = _int_query(request, "limit", 1000)
        if not limit or not 1 <= limit <= 10000:
            raise BadRequest("limit must be between 1 and 10000", param="limit")
        await sessions.state(sid)
        evs = await sessions.store.events(sid, after=after, limit=limit)
        return _json({"object": "list", "data": [e.to_json(sid) for e in evs],
                      "next": evs[-1].id if evs else None})

    @owned.get("/v1/sessions/{sid}/subscribe")
    async def subscribe(sid: str, request: Request):
        after = _after(request, sid)
        await sessions.state(sid)
        return StreamingResponse(subscription(sessions, sid, after), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    @owned.get("/v1/sessions/{sid}/resume")
    async def resume(sid: str, request: Request):
        after, frame = _cursor(request, sid)
        await sessions.state(sid)
        go_on = request.query_params.get("continue", "true") != "false"
        turn_budget = _int_query(request, "budget", None)  # a native turn's whole budget (the caller knows it)
        qos = qos_for(request)

        async def continue_cut():
            """A generation cut by a restart or by its client going away: generate the rest
            of its budget on the session (the tokens an uncut run would have given: the
            sampler's draws are keyed by position). An API request's budget is in its
            params; a native turn's comes with the resume (?budget=, the turn's tokens in all)."""
            st = await sessions.state(sid)
            budget = st.params.get("max_tokens", turn_budget)
            left = int(budget) - st.turn_tokens if budget is not None else 0
            if not go_on or left < 1 or sessions.busy(sid):
                return None
            allowed = LOADS_REFUSED.set(None)  # the owner's own cut generation may load its model again
            try:
                eng = await models.get(st.params.get("model"))
            finally:
                LOADS_REFUSED.reset(allowed)
            left = min(left, eng.n_ctx - len(st.tokens))  # a caller's ?budget= never asks past the window
            if left < 1:
                return None
            req, _ = await models.service.generate(eng, sid, max_tokens=left, overrides={}, stop=None, qos=qos,
                                                   cache_ns=cache_ns.of_session(st.params, request))
            eng.keep_running(req.id)  # nobody reads its chunks: the resumed stream reads the log
            return sessions.watch(sid)

        api = (await sessions.row(sid)).api
        return StreamingResponse(rest_of_generation(sessions, sid, after, continue_cut, frame),
                                 media_type=media_type(api), headers=SSE_HEADERS)

    @owned.post("/v1/sessions/{sid}/pin")
    async def pin(sid: str, request: Request):
        st = await sessions.state(sid)
        eng = await engine_of(sid)
        if not hasattr(eng, "pin"):
            raise BadRequest("session pins need a local engine (this model runs on a fleet)", code="pins_unsupported")
        # TooManyPins (409) beyond the share
        warm = eng.pin(sid, list(st.tokens), cache_ns.of_session(st.params, request))
        return _json({"id": sid, "object": "session.pin", "pinned": True, "warm_tokens": warm})

    @owned.post("/v1/sessions/{sid}/unpin")
    async def unpin(sid: str):
        st = await sessions.state(sid)
        eng = models.engines.get(models.resolve_id(st.params.get("model")))  # an unloaded model holds no pins
        was = bool(eng.pin(sid, None)) if eng is not None and hasattr(eng, "pin") else False
        return _json({"id": sid, "object": "session.pin", "pinned": False, "was_pinned": was})

    @owned.post("/v1/sessions/{sid}/fork")
    async def fork(sid: str, request: Request):
        body = parse(SessionFork, await request.body() or b"{}")
        st = await sessions.fork(sid, body.at, owner=owner_of(request))
        return _json(await summary(st.id), 201)

    @owned.post("/v1/sessions/{sid}/trim")
    async def trim(sid: str, request: Request):
        body = parse(SessionTrim, await request.body())
        await sessions.trim(sid, body.to)
        return _json(await summary(sid))

    app.include_router(owned)


async def _generated(sid: str, stream):
    """A native generation stream: each committed Generated event with its cursor as id,
    then [DONE]."""
    async for c in stream:
        if c.error is not None:
            yield event({"type": "error", "session": sid, **c.error.body()})
        if c.event_id is not None or c.finish is not None:
            yield event({"type": "generated", "session": sid, "id": c.event_id, "text": c.text, "tokens": c.tokens,
                         "reasoning": c.reasoning, "calls": [d.to_wire() for d in c.calls],
                         "finish": c.finish.log_name if c.finish else None,
                         **({"usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                                       "cached_tokens": c.cached_tokens}} if c.finish else {})},
                        cursor(sid, c.event_id))
        if c.finish is not None:
            break
    yield DONE
