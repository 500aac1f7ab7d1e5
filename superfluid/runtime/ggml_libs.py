"""The shared libraries llama-cpp-python loaded (llama.cpp and ggml), for what it binds none
of (the RPC backend, a persistent threadpool) through ctypes."""

from __future__ import annotations

from pathlib import Path

import llama_cpp


def lib_dir() -> Path:
    return Path(llama_cpp.__file__).parent / "lib"


def loaded(name: str) -> Path:
    """The file llama.cpp itself loaded for a library: its soname (`.so.0`). The wheel holds
    copies, not links, under each name, and another copy would be a second ggml, with its
    own devices, threads and abort hook."""
    so0 = lib_dir() / f"{name}.so.0"
    return so0 if so0.exists() else lib_dir() / f"{name}.so"
