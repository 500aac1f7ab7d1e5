"""Frozen configuration for one `superfluid serve`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8453


def default_threads() -> int:
    # ggml threads spin at barriers: as many threads as cores makes decode 30-50x slower as
    # soon as anything else runs (NOTES.md). Leave one core to the daemon.
    return max(1, (os.cpu_count() or 2) - 1)


def home() -> Path:
    return Path(os.environ.get("SUPERFLUID_HOME", "~/.superfluid")).expanduser()


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    model_id: str
    max_batch: int = 8
    max_context: int | None = None  # None: the model's trained window, capped to fit memory
    threads: int = 1
    step_tokens: int = 256  # token budget per step (decodes first, then prefill chunks)
    max_respawns: int = 3


@dataclass(frozen=True)
class ServeConfig:
    engine: EngineConfig
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = 16 * 1024 * 1024
