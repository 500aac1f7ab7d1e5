"""The one sequence every generating route runs once it has translated its request in:
submit the GenRequests through the service (checked, the prompt committed, the access log's
record handed over with the key that owns the sessions), then either stream the chunks back
in the API's own frames or collect whole choices (the first error raised, typed). Each API
module only translates its request in and its events out.

A Run owns its generations' cleanup: one that no response streamed, no collect read and no
background task took is cancelled when its handler exits, whatever it raised (RunsEnd: a
500 after the submit would otherwise leave it running with nobody reading, holding a lane)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..request import Chunk, GenRequest
from . import cache_ns
from . import openai as oa
from .policy import owner_of
from .streams import COMMENT, access_record, collect, raise_first_error, sse


RUNS = "runs"  # the request scope's state entry: the Runs its handler submitted (RunsEnd)


class RunsEnd:
    """ASGI middleware: when a request's handler (and its response) is done, however it ended,
    every Run it submitted that nothing took over is cancelled (Run.release)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        runs: list[Run] = []
        scope.setdefault("state", {})[RUNS] = runs
        try:
            await self.app(scope, receive, send)
        finally:
            for run in runs:
                run.release()


class Run:
    """A request's generations, submitted: `streams` (one per choice) until streamed, collected
    or handed to a task that reads them (`take`); any other way out cancels them (RunsEnd)."""

    def __init__(self, request: Request, service, engine, reqs: list[GenRequest],
                 streams: list[AsyncIterator[Chunk]]):
        self.request, self.service, self.engine, self.reqs, self.streams = request, service, engine, reqs, streams
        self.owned = False  # a response, a collect or a task reads the streams: it ends them
        runs = request.scope.get("state", {}).get(RUNS)
        if runs is not None:
            runs.append(self)

    def release(self) -> None:
        """Cancel the generations unless something took them over (their reader ends them)."""
        if self.owned:
            return
        self.owned = True
        for r in self.reqs:
            self.engine.cancel(r.id)

    def take(self) -> list[AsyncIterator[Chunk]]:
        """The streams, for a reader outside this request (a background response's task)."""
        self.owned = True
        return self.streams

    @classmethod
    async def submit(cls, request: Request, service, engine, reqs: list[GenRequest], bodies=None, *, api: str,
                     params: dict | None = None, salt: str | None = None) -> Run:
        """Check and start `reqs` (sessions recorded as `api` with `params`, owned by the
        request's key, in its prefix-cache namespace salted with `salt`: api/cache_ns.py); a
        refused request raises its typed error before anything starts."""
        ns = cache_ns.namespace(request, salt)
        for r in reqs:
            r.cache_ns = ns
        if ns:  # a continuation of the generation keeps it (api/sessions.py: its resume, its pin)
            params = {**(params or {}), cache_ns.PARAM: ns}
        streams = await service.submit(engine, reqs, bodies, api=api, params=params, owner=owner_of(request),
                                       access=access_record(request))
        return cls(request, service, engine, reqs, streams)

    @classmethod
    async def generate(cls, request: Request, service, engine, sid: str, **kw) -> Run:
        """The next turn of a native session (Service.generate)."""
        req, stream = await service.generate(engine, sid, access=access_record(request),
                                             cache_ns=cache_ns.namespace(request), **kw)
        return cls(request, service, engine, [req], [stream])

    def stream(self, frames: AsyncIterator[bytes], media_type: str = "text/event-stream",
               keepalive: bytes | None = COMMENT) -> StreamingResponse:
        """The response streaming `frames` (built from self.streams); when it ends however
        it ends, the service decides what that means for the generations (Service.on_close).
        A response built but never sent (the handler raised after this) owns nothing: its
        generations are cancelled when the handler exits (RunsEnd)."""
        close = self.service.on_close(self.engine, self.reqs)

        def on_close() -> None:  # the response was sent, or began to be: it ended the generations
            self.owned = True
            close()
        return sse(frames, on_close, self.reqs, media_type, keepalive)

    async def collect(self, wrap: Callable[[AsyncIterator[Chunk]], AsyncIterator[Chunk]] | None = None
                      ) -> list[oa.Choice]:
        """Every choice whole (`wrap` sees each stream's chunks on the way); the first
        choice's error is raised, typed, as it would be had the daemon raised it."""
        streams = self.streams if wrap is None else [wrap(s) for s in self.streams]
        choices = await collect(self.request, streams)
        self.owned = True  # every choice ended (had collect raised, RunsEnd would cancel what runs on)
        raise_first_error(choices)
        return choices
