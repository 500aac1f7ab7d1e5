"""The models a daemon serves: each loaded one is an Engine with its own worker process.

The first model is the default: loaded at start, never unloaded for idleness. Others come
from `--model` (loaded at start) or `--model-dir` (loaded on their first request). Loading
and unloading are serialized; an unloaded model loads again on its next request."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .config import EngineConfig
from .engine import Engine
from .errors import ModelLoadError, ModelNotFound, ModelUnloaded
from .runtime.registry import ModelSource, default_runtime, resolve

log = logging.getLogger("superfluid.models")


class Models:
    def __init__(self, base: EngineConfig, build: Callable[[EngineConfig], Engine], *,
                 idle_timeout: float | None = None):
        self.base = base
        self._build = build
        self.idle_timeout = idle_timeout
        self.sources: dict[str, ModelSource] = {}  # every model we can serve, by id
        self.engines: dict[str, Engine] = {}  # the loaded ones (a live dict: metrics read it)
        self.default: str | None = None
        self.on_load: list[Callable[[Engine], None]] = []
        self.sessions: Any = None  # sessions.Sessions, when the daemon has a session store
        self.embedding: str | None = None  # where embedding requests that name no model go
        self.announce = False  # log loads once the server is up (the banner covers the first ones)
        self._lock = asyncio.Lock()

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

    def resolve_id(self, model: str | None) -> str:
        if model is None:
            assert self.default is not None
            return self.default
        for mid in self.sources:
            if model == mid or model.lower() == mid.lower():
                return mid
        raise ModelNotFound(f"The model '{model}' does not exist; this server has: {', '.join(self.sources)}",
                            param="model")

    async def get(self, model: str | None) -> Engine:
        mid = self.resolve_id(model)
        eng = self.engines.get(mid)
        return eng if eng is not None else await self.load(mid)

    async def load(self, model: str) -> Engine:
        if model not in self.sources and Path(model).suffix == ".gguf":
            self.add(resolve(model))
            model = resolve(model).id
        mid = self.resolve_id(model)
        async with self._lock:
            if mid in self.engines:
                return self.engines[mid]
            src = self.sources[mid]
            eng = self._build(replace(self.base, model_path=src.path, model_id=mid, runtime=self._runtime(src)))
            await eng.start()
            self.engines[mid] = eng
            for hook in self.on_load:
                hook(eng)
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

    async def unload(self, model: str, *, forget: bool = False) -> bool:
        mid = self.resolve_id(model)
        async with self._lock:
            eng = self.engines.pop(mid, None)
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

    async def reap_idle(self) -> None:
        """Unload models idle for idle_timeout seconds (never the default), forever."""
        if not self.idle_timeout:
            return
        while True:
            await asyncio.sleep(max(0.5, self.idle_timeout / 4))
            now = time.monotonic()
            for mid, eng in list(self.engines.items()):
                if mid != self.default and eng.idle and now - eng.last_used >= self.idle_timeout:
                    log.info("%s idle for %.0f s", mid, now - eng.last_used)
                    await self.unload(mid)
