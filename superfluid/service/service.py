"""The service: the one place that orders a request's work. A generation's prompt is
committed to the session log first, then the engine starts it; the log never calls an
engine, the engine never knows the log's class (it commits through delivery.SessionLog).
Without a session log (a fleet node, `--no-sessions`), requests go straight to the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from ..errors import QueueFull, SessionNotFound
from ..limits import check_generation, output_budget
from ..request import Chunk, GenRequest, Qos
from ..session.events import Body, Message
from .sessions import Sessions


class Service:
    def __init__(self, sessions: Sessions | None):
        self.sessions = sessions

    async def submit(self, engine, reqs: list[GenRequest], bodies: list[Body] | None = None, *, api: str,
                     params: dict | None = None, owner: str | None = None,
                     access: dict | None = None) -> list[AsyncIterator[Chunk]]:
        """Start a request's generations (one per choice). With a session log each is a
        session, recorded under `owner` (its key's name): `bodies` are the prompt's events
        (one raw prompt message when not given), committed before the engine sees it.
        `access` (the HTTP request's access-log record) gets the counts and timings once
        every choice has ended, whatever the API."""
        first = reqs[0]
        check_generation(first.stop, len(reqs), first.sampling.top_logprobs, first.sampling.grammar)
        _room(engine, len(reqs))
        for r in reqs:
            _fit(engine, r)
            engine.check(r)
        if self.sessions is not None:
            params = dict(params or {})
            if bodies is None:
                bodies = [Message("prompt", engine.tokenizer.decode(reqs[0].prompt), tuple(reqs[0].prompt))]
                params["raw"] = True
            await self.sessions.open_requests(engine.model_id, reqs, bodies, api=api, params=params, owner=owner,
                                              cancel=lambda r: (lambda: engine.cancel(r.id)))
        streams: list = []
        try:
            for r in reqs:
                streams.append(engine.submit(r))
        except BaseException:
            for r in reqs:
                engine.cancel(r.id)
                if self.sessions is not None:
                    self.sessions.finished(r.id)
            raise
        return recorded(access, engine, reqs[0].qos, streams)

    async def generate(self, engine, sid: str, *, max_tokens: int | None, overrides: dict,
                       stop: tuple[str, ...] | None, qos: Qos, access: dict | None = None,
                       cache_ns: str = "") -> tuple[GenRequest, AsyncIterator[Chunk]]:
        """Generate on a session: its open turn goes on, or a new assistant turn opens (in
        prefix-cache namespace `cache_ns`)."""
        sessions = self._log()
        async with sessions.turn(sid):
            req, bodies = await sessions.next_turn(engine, sid, max_tokens=max_tokens, overrides=overrides,
                                                   stop=stop, qos=qos)
            req.cache_ns = cache_ns
            check_generation(req.stop, 1, req.sampling.top_logprobs, req.sampling.grammar)
            _room(engine, 1)
            _fit(engine, req)
            engine.check(req)
            await sessions.begin(req, bodies, lambda: engine.cancel(req.id))
            try:
                return req, recorded(access, engine, req.qos, [engine.submit(req)])[0]
            except BaseException:
                sessions.finished(req.id)
                raise

    def on_close(self, engine, reqs: list[GenRequest]) -> Callable[[], None]:
        """What to do when a streamed response ends however it ends: a session's generation
        gets the grace period to be resumed; any other is cancelled."""
        sessions = self.sessions
        if sessions is None or not all(r.session for r in reqs):
            def cancel() -> None:
                for r in reqs:
                    engine.cancel(r.id)
            return cancel
        watched = []
        for r in reqs:
            engine.keep_running(r.id)
            watched.append(sessions.watch(r.session))  # type: ignore[arg-type]

        def unwatch() -> None:
            for g in watched:
                sessions.unwatch(g)
        return unwatch

    def _log(self) -> Sessions:
        if self.sessions is None:
            raise SessionNotFound("this daemon keeps no session log (--no-sessions)", param="session")
        return self.sessions


def recorded(access: dict | None, engine, qos: Qos,
             streams: list[AsyncIterator[Chunk]]) -> list[AsyncIterator[Chunk]]:
    """The streams, passed through, filling the access-log record (counts and timings,
    never content) from their final chunks once every one has ended. Closing one closes
    the engine's stream under it (which cancels what is not kept running)."""
    if access is None:
        return streams
    access.update(model=engine.model_id, qos=qos.name.lower())
    finals: list[Chunk] = []

    async def one(it: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        try:
            async for c in it:
                if c.finish is not None:
                    finals.append(c)
                    if len(finals) == len(streams):
                        _record(access, finals)
                yield c
        finally:
            close = getattr(it, "aclose", None)
            if close is not None:
                await close()
    return [one(it) for it in streams]


def _record(rec: dict, finals: list[Chunk]) -> None:
    first = finals[0]
    rec.update(prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
               completion_tokens=sum(c.completion_tokens for c in finals),
               finish=first.finish.openai if first.finish else None,
               ttft_s=min((c.ttft_s for c in finals if c.ttft_s is not None), default=None))


def _fit(engine, req: GenRequest) -> None:
    """The request's output budget within the window and the operator's cap (limits.output_budget)."""
    if req.max_tokens >= 1:  # a budget below 1 is the client's error, which the engine's check names
        req.max_tokens = output_budget(req.max_tokens, len(req.prompt), engine.n_ctx,
                                       getattr(engine.cfg, "max_output", None))


def _room(engine, n: int) -> None:
    """A model's queue is bounded (--max-queue): past it, a typed 503 with Retry-After."""
    limit = engine.cfg.max_queue
    if engine.queued + n > limit:
        raise QueueFull(f"the model {engine.model_id} has {engine.queued} generations waiting (the limit is "
                        f"{limit}); retry shortly", param="model")
