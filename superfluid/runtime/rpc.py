"""llama.cpp's RPC backend (ggml-rpc) through ctypes: llama-cpp-python binds none of it.

It exists only in a llama-cpp-python built with `-DGGML_RPC=ON` (its CMake then installs
`libggml-rpc` beside the other backends). pip caches a built wheel by its source, not by
its CMake options, so a build without RPC can win silently: `library()` says so, with the
command that rebuilds it.

A node serves its CPU to heads with `serve()` (ggml's server: one client at a time, blocking,
so it runs on a thread of its own); a head's worker turns an endpoint into llama.cpp devices
with `devices()`. ggml aborts the process when a server it talks to goes away: `on_abort`
lets the worker say why (a typed error to the daemon) before it goes."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

from ..errors import ModelLoadError
from .ggml_libs import loaded

# the fix, in a superfluid checkout (scripts/llama-cmake-args.sh names the options for this CPU)
REBUILD = "./install.sh"
CPU = 0  # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_CPU

_libs: tuple[ctypes.CDLL, ctypes.CDLL, ctypes.CDLL] | None = None
_abort_cb = None  # the ctypes callback ggml holds: kept alive here


class RpcUnavailable(ModelLoadError):
    code = "rpc_unavailable"


def library() -> tuple[ctypes.CDLL, ctypes.CDLL, ctypes.CDLL]:
    """(libggml-rpc, libggml-base, libggml), typed; RpcUnavailable naming the rebuild when this
    llama-cpp-python has no RPC backend."""
    global _libs
    if _libs is not None:
        return _libs
    path = loaded("libggml-rpc")
    if not path.exists():
        raise RpcUnavailable(f"this llama-cpp-python was built without llama.cpp's RPC backend "
                             f"(no {path.name} in {path.parent}); rebuild it: {REBUILD}")
    rpc = ctypes.CDLL(str(path))
    base = ctypes.CDLL(str(loaded("libggml-base")))
    ggml = ctypes.CDLL(str(loaded("libggml")))
    try:
        rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                      ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        rpc.ggml_backend_rpc_start_server.restype = None
        rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
        rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
        ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        base.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
        base.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
        base.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        base.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
        base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                 ctypes.POINTER(ctypes.c_size_t)]
        base.ggml_backend_dev_memory.restype = None
        base.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
        base.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
        base.ggml_set_abort_callback.argtypes = [ctypes.c_void_p]
        base.ggml_set_abort_callback.restype = ctypes.c_void_p
    except AttributeError as e:
        raise RpcUnavailable(f"{path.name} lacks a function this build needs ({e}); rebuild it: {REBUILD}") from None
    _libs = (rpc, base, ggml)
    return _libs


def memory(dev: int) -> tuple[int, int]:
    """(free, total) bytes of a device: a node's RPC device asks its server."""
    _, base, _ = library()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def cpu_device() -> int:
    dev = library()[2].ggml_backend_dev_by_type(CPU)
    if not dev:
        raise RpcUnavailable("llama.cpp has no CPU device")
    return dev


def cpu_buffer_type() -> int:
    """ggml's CPU buffer type, the one llama.cpp compares a tensor override against (so the
    override still gets the CPU's repacked layouts)."""
    return library()[1].ggml_backend_dev_buffer_type(cpu_device())


def serve(port: int, cache_dir: str, threads: int) -> None:
    """ggml's RPC server for this host's CPU on 127.0.0.1:port, forever (blocking: run it on
    a thread of its own; ctypes lets go of the GIL). Loopback only: heads reach it through
    Link F (transport.Tunnels), never over the network. Tensors over 10 MiB that a head
    sent once are kept under `cache_dir` by their hash, so a restarted node is not sent
    them again."""
    rpc = library()[0]
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    devs = (ctypes.c_void_p * 1)(cpu_device())
    rpc.ggml_backend_rpc_start_server(f"127.0.0.1:{port}".encode(), cache_dir.encode(), max(1, threads), 1, devs)


def devices(endpoint: str) -> list[int]:
    """The llama.cpp devices of the RPC server at `endpoint` (host:port), for a model's
    `devices` list; RpcUnavailable when it does not answer."""
    rpc, base, _ = library()
    reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
    if not reg:
        raise ModelLoadError(f"the RPC server at {endpoint} did not answer")
    return [base.ggml_backend_reg_dev_get(reg, i) for i in range(base.ggml_backend_reg_dev_count(reg))]


def on_abort(fn: Callable[[str], None]) -> None:
    """Call `fn(message)` when ggml aborts the process (an RPC server that went away does
    that); the process still ends right after (os._exit if `fn` returns)."""
    global _abort_cb
    base = library()[1]
    proto = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

    def hook(msg: bytes | None) -> None:
        try:
            fn((msg or b"").decode(errors="replace").strip())
        finally:
            os._exit(70)
    _abort_cb = proto(hook)
    base.ggml_set_abort_callback(ctypes.cast(_abort_cb, ctypes.c_void_p))
