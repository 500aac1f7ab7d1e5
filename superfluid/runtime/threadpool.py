"""A persistent ggml threadpool for a llama.cpp context, as llama-server attaches one
(llama-cpp-python attaches none: each graph compute then starts its threads and joins them).

Its threads wait for the next graph polling for a while (`poll`, llama-server's default 50)
before they sleep, so a decode that follows another starts at once; an idle worker's threads
sleep. Through the daemon (docs/performance.md), a single stream 0.918x -> 1.004x
llama-server with it (paired, 20 rounds), and 1.064x with multi-step decode plans as well,
which leave the polling threads the cores the API process needed. Bound through ctypes
(llama-cpp-python binds none of it); the parameters' layout is checked against what
`ggml_threadpool_params_init` writes, and where it differs no pool is attached."""

from __future__ import annotations

import ctypes
import logging

import llama_cpp.llama_cpp as ll

from .ggml_libs import loaded

log = logging.getLogger("superfluid.runtime")

POLL = 50  # llama-server's --poll: 0 sleeps at once, 100 polls longest
MAX_THREADS = 512  # GGML_MAX_N_THREADS: the cpumask's bools come first in the parameters
PARAMS_SIZE = 1024  # more than struct ggml_threadpool_params holds (528 bytes)


class ThreadPool:
    """Threads for one llama.cpp context (attached at once); close() after llama_free."""

    def __init__(self, ctx, n_threads: int, poll: int = POLL):
        base = ctypes.CDLL(str(loaded("libggml-base")))
        self._cpu = ctypes.CDLL(str(loaded("libggml-cpu")))
        base.ggml_threadpool_params_init.argtypes = [ctypes.c_void_p, ctypes.c_int]
        base.ggml_threadpool_params_init.restype = None
        self._cpu.ggml_threadpool_new.argtypes = [ctypes.c_void_p]
        self._cpu.ggml_threadpool_new.restype = ctypes.c_void_p
        self._cpu.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
        self._cpu.ggml_threadpool_free.restype = None
        attach = ll._lib.llama_attach_threadpool
        attach.argtypes = [ll.llama_context_p_ctypes, ctypes.c_void_p, ctypes.c_void_p]
        attach.restype = None
        params = ctypes.create_string_buffer(PARAMS_SIZE)
        base.ggml_threadpool_params_init(params, n_threads)
        if _field(params, 0) != n_threads or _field(params, 2) != POLL:
            raise OSError("ggml_threadpool_params is not laid out as this build expects")
        ctypes.c_uint32.from_buffer(params, MAX_THREADS + 8).value = poll
        self.pool = self._cpu.ggml_threadpool_new(params)
        if not self.pool:
            raise OSError("ggml_threadpool_new failed")
        attach(ctx, self.pool, self.pool)

    def close(self) -> None:
        if self.pool:
            self._cpu.ggml_threadpool_free(self.pool)
            self.pool = None


def _field(params: ctypes.Array, i: int) -> int:
    """The i-th 4-byte field after the cpumask: n_threads, prio, poll."""
    at = MAX_THREADS + 4 * i
    return int.from_bytes(params.raw[at:at + 4], "little")


def attach(ctx, n_threads: int) -> ThreadPool | None:
    """A pool for ctx, or None (llama.cpp's own threads each compute) where it cannot be made."""
    if n_threads < 1:
        return None
    try:
        return ThreadPool(ctx, n_threads)
    except (OSError, AttributeError) as e:
        log.warning("no persistent threadpool (%s): llama.cpp starts its threads for each step", e)
        return None
