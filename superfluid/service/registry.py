"""The models a daemon serves: each loaded one is an Engine with its own worker process.

The first model is the default: loaded at start, never unloaded for idleness or by a
client's keep_alive (/health reports ready only while it is loaded; an admin unloads it with
/v1/models/unload). Others come from `--model` (loaded at start) or `--model-dir` (loaded on
their first request), and are unloaded after --idle-timeout idle seconds, or what a client's
Ollama keep_alive asked for that model. Loading and unloading are serialized; an unloaded
model loads again on its next request."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path

from ..config import EngineConfig
from .service import Service
from .sessions import Sessions
from ..engine.contract import EngineAPI
from ..errors import Forbidden, ModelLoadError, ModelNotFound, ModelUnloaded
from ..limits import MAX_PULLS
from ..runtime import hub
from ..runtime.pull_bounds import Bounds, PullInProgress
from ..runtime.registry import ModelSource, default_runtime, resolve

log = logging.getLogger("superfluid.models")

# Why the request being served may not load a model (None: it may). The API's guard sets it
# for each request: a GET never loads one, and with keys configured only an admin key does.
LOADS_REFUSED: ContextVar[str | None] = ContextVar("loads_refused", default=None)

REAP_S = 0.5  # how often idle models are looked for
GRACE_S = 1.0  # a model handed to a request is not unloaded sooner (it may not have submitted yet)


class Models:
    def __init__(self, base: EngineConfig, build: Callable[[EngineConfig], EngineAPI], *,
                 idle_timeout: float | None = None, sessions: Sessions | None = None, embedding: str | None = None,
                 strict: bool = False, engines: dict[str, EngineAPI] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.base = base
        self._build = build  # an engine for a model's settings, wired by the daemon (daemon.build)
        self.idle_timeout = idle_timeout
        self.clock = clock  # idle time is read on it (engines stamp last_used on the same one)
        self.sources: dict[str, ModelSource] = {}  # every model we can serve, by id
        self.engines = {} if engines is None else engines  # the loaded ones (a live dict: metrics read it)
        self.default: str | None = None
        self.sessions = sessions  # the session log, when the daemon has a session store
        self.service = Service(sessions)
        self.embedding = embedding  # where embedding requests that name no model go
        self.announce = False  # log loads once started (the banner covers the first ones)
        self.keep_alive: dict[str, float] = {}  # idle seconds a client asked a loaded model to stay (inf: forever)
        self.aliases: dict[str, str] = {}  # --alias: a name (lower case) -> the id it stands for
        self.strict = strict  # --strict-models: a name we do not serve is a 404 even with one model
        self._lock = asyncio.Lock()
        self.pull_bounds = Bounds()  # a pull's size and the disk's room (daemon.build: the settings')
        self._pulling: set[str] = set()  # the hub names being pulled: one pull per name at a time

    def add(self, src: ModelSource) -> str:
        mid = src.id
        if mid in self.sources and self.sources[mid].path != src.path:
            raise ModelLoadError(f"two models are named {mid}: {self.sources[mid].path} and {src.path}")
        self.sources[mid] = src
        if self.default is None:
            self.default = mid
        return mid

    def add_dir(self, directory: str) -> list[str]:
        d = Path(directory).expanduser()
        if not d.is_dir():
            raise ModelLoadError(f"--model-dir {directory} is not a directory")
        return [self.add(resolve(str(p))) for p in sorted(d.glob("*.gguf"))]

    def alias(self, name: str, target: str | None = None) -> None:
        """--alias: `name` stands for the model `target` (None: the default model)."""
        try:
            mid = self.resolve_id(target)
        except ModelNotFound:
            raise ModelLoadError(f"--alias {name}={target}: no model served is named {target}") from None
        if any(name.lower() == m.lower() for m in self.sources) and name.lower() != mid.lower():
            raise ModelLoadError(f"--alias {name}: a served model already has that name")
        self.aliases[name.lower()] = mid

    def resolve_id(self, model: str | None, *, fallback: bool = False) -> str:
        """The id of the model a name stands for: None is the default model, then ids and
        --alias names (any case). With `fallback` (a generation or embedding request), a name we
        do not serve is answered by the one model served, as llama-server does (clients
        hard-code names such as gpt-3.5-turbo), unless --strict-models."""
        if model is None:
            assert self.default is not None
            return self.default
        for mid in self.sources:
            if model == mid or model.lower() == mid.lower():
                return mid
        target = self.aliases.get(model.lower())
        if target is not None and target in self.sources:
            return target
        if fallback and not self.strict and len(self.sources) == 1 and self.default is not None:
            return self.default
        raise ModelNotFound(f"The model '{model}' does not exist; this server has: {', '.join(self.sources)}",
                            param="model")

    async def get(self, model: str | None) -> EngineAPI:
        """The engine that answers a request naming `model` (loaded on demand)."""
        mid = self.resolve_id(model, fallback=True)
        eng = self.engines.get(mid)
        if eng is None:
            why = LOADS_REFUSED.get()
            if why is not None:
                raise Forbidden(f"the model {mid} is not loaded, and {why}", param="model", code="model_not_loaded")
            return await self.load(mid)
        eng.last_used = self.clock()  # not reaped between here and its request's submit
        return eng

    @staticmethod
    def pullable(model: str) -> bool:
        """A hub name (REPO[:QUANT|:FILE]) that is not a path on this machine."""
        return hub.parse(model) is not None and not Path(model).expanduser().exists()

    async def pull(self, name: str, report: hub.Report | None = None) -> str:
        """Pull a model by its hub name (off the event loop) and add it to the served ones,
        unloaded (Ollama's /api/pull); its id."""
        return self.add(await self._pull(name, report))

    async def _pull(self, name: str, report: hub.Report | None = None) -> ModelSource:
        """A hub name pulled (in a thread, within pull_bounds), one pull per name at a time and
        MAX_PULLS in all: another pull of a name being pulled is a 409."""
        key = str(hub.parse(name) or name).lower()
        if key in self._pulling:
            raise PullInProgress(f"{name} is being pulled already; retry once that pull is done", param="model")
        if len(self._pulling) >= MAX_PULLS:
            raise PullInProgress(f"{len(self._pulling)} pulls are running, the most this server runs at once; "
                                 "retry once one is done", param="model")
        self._pulling.add(key)
        # the name is held until the download ends, even when the request waiting on it goes
        done = asyncio.ensure_future(asyncio.to_thread(resolve, name, report, self.pull_bounds))
        done.add_done_callback(lambda _: self._pulling.discard(key))
        return await asyncio.shield(done)

    async def load(self, model: str) -> EngineAPI:
        """Load a served model, or (an admin's POST /v1/models/load) a GGUF by its path or a
        model by its hub name: pulled off the event loop, then served under that name."""
        if not any(model.lower() == m.lower() for m in self.sources) and (
                Path(model).suffix == ".gguf" or self.pullable(model)):
            model = self.add(await (self._pull(model) if self.pullable(model) else asyncio.to_thread(resolve, model)))
        mid = self.resolve_id(model)
        async with self._lock:
            if mid in self.engines:
                return self.engines[mid]
            src = self.sources[mid]
            # off the event loop: building reads the model file (its vocabulary, its template),
            # which blocked every other request for a fifth of a second on a 49k-token vocabulary
            eng = await asyncio.to_thread(
                self._build, replace(self.base, model_path=src.path, model_id=mid, runtime=self._runtime(src)))
            await eng.start()
            self.engines[mid] = eng
            log.log(logging.INFO if self.announce else logging.DEBUG, "loaded %s (%s)", mid, src.path)
            return eng

    def _runtime(self, src: ModelSource) -> str:
        """The model's own runtime (llama.cpp for a GGUF, transformers for a folder, sentence
        for an embedding or cross-encoder folder), unless --runtime chose one for every model
        (which a sentence folder still overrides)."""
        if src.path == self.base.model_path:
            return self.base.runtime
        own = default_runtime(src.path)
        chosen = self.base.runtime != default_runtime(self.base.model_path)  # --runtime said so
        if own == "sentence" or self.base.runtime == "pipeline" or not chosen:
            return own
        return self.base.runtime

    async def start(self, ids: list[str]) -> None:
        """Load these models now (the default and every --model; --model-dir ones load on
        demand); later loads are logged. A failed load unloads what had loaded."""
        try:
            for mid in ids:
                await self.load(mid)
        except BaseException:
            await self.close()
            raise
        self.announce = True

    async def unload(self, model: str, *, forget: bool = False) -> bool:
        mid = self.resolve_id(model)
        async with self._lock:
            eng = self.engines.pop(mid, None)
            self.keep_alive.pop(mid, None)
            if forget and mid != self.default:
                self.sources.pop(mid, None)
            if eng is None:
                return False
            await eng.close(ModelUnloaded(f"the model {mid} was unloaded; retry to load it again"))
            log.info("unloaded %s", mid)
            return True

    async def close(self) -> None:
        for mid in list(self.engines):
            await self.engines.pop(mid).close()

    def keep(self, mid: str, seconds: float | None) -> None:
        """A client's keep_alive for a loaded model: stay loaded `seconds` after its last
        request (0: unload it once idle; inf: never); None: back to --idle-timeout."""
        if seconds is None:
            self.keep_alive.pop(mid, None)
        elif mid in self.engines:
            self.keep_alive[mid] = seconds

    def timeout(self, mid: str) -> float | None:
        """Idle seconds after which the model is unloaded (None: never)."""
        t = self.keep_alive.get(mid, self.idle_timeout)
        return None if mid == self.default or t is None or math.isinf(t) else t

    def expires(self, mid: str) -> float | None:
        """When (on the clock) the loaded model is unloaded if nobody uses it (None: never)."""
        eng, t = self.engines.get(mid), self.timeout(mid)
        return None if eng is None or t is None else eng.last_used + max(t, GRACE_S)

    async def reap_idle(self) -> None:
        """Unload models idle for their timeout (never the default), forever."""
        while True:
            await asyncio.sleep(REAP_S)
            await self.reap()

    async def reap(self) -> list[str]:
        """One look for idle models: unload those idle past their timeout; their ids."""
        now, gone = self.clock(), []
        for mid, eng in list(self.engines.items()):
            t = self.timeout(mid)
            if t is not None and eng.idle and now - eng.last_used >= max(t, GRACE_S):
                log.info("%s idle for %.0f s", mid, now - eng.last_used)
                if await self.unload(mid):
                    gone.append(mid)
        return gone
