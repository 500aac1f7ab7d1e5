"""The daemon in one process: daemon.build() with a fake engine (tests/fakes.py: the real
Engine, scheduler, sampler and Link W codec over a scripted runtime) and the real session
store, service, metrics, access log and app, driven through httpx's ASGI transport. For
tests of HTTP shapes, auth, errors and access-log fields, where a real process adds only
time; what crosses a process boundary keeps its real processes (tests/integration/)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import orjson

from superfluid.config import EngineConfig, ServeConfig
from superfluid.daemon import App, build
from superfluid.runtime.registry import ModelSource
from superfluid.session.store import Store

from .fakes import FakeModel

MODEL = "fake"
BASE = "http://127.0.0.1:8080"  # the Host the client sends (a loopback bind, as the daemon's default)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(orjson.loads(record.getMessage()))


class Clock:
    """A clock tests advance instead of sleeping (idle time, pins)."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Harness:
    app: App
    client: httpx.AsyncClient
    model: FakeModel
    clock: Clock
    access: list[dict] = field(default_factory=list)  # the access log's JSON lines, parsed


def config(*, max_batch: int = 4, kv_dir: str = "", **serve) -> ServeConfig:
    ec = EngineConfig(model_path="fake.gguf", model_id=MODEL, max_batch=max_batch, threads=1, kv_dir=kv_dir)
    serve = {"models": (ModelSource("fake.gguf", MODEL),), **serve}
    return ServeConfig(ec, **{"host": "127.0.0.1", "sessions_cache": True, "log_format": "json", "tui": False, **serve})


@contextlib.asynccontextmanager
async def harness(model: FakeModel | None = None, *, store: Store | None = None, **serve) -> AsyncIterator[Harness]:
    """A built and started daemon on `model` (a FakeModel saying "Hello world." by default);
    `serve` are ServeConfig fields (policies, cors_origins, ...)."""
    m, clock, lines = model or FakeModel(), Clock(), _Lines()
    app = build(config(**serve), store=store or Store(None), engine_factory=m.factory(), clock=clock)
    access = logging.getLogger("superfluid.access")
    access.addHandler(lines)
    level = access.level
    access.setLevel(logging.INFO)
    try:
        await app.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.asgi), base_url=BASE) as client:
            yield Harness(app, client, m, clock, lines.records)
    finally:
        access.removeHandler(lines)
        access.setLevel(level)
        await app.close()
        app.store.close()


def run(body, model: FakeModel | None = None, **serve):
    """`await body(harness)` on a fresh harness; its result."""
    async def go():
        async with harness(model, **serve) as h:
            return await body(h)
    return asyncio.run(go())
