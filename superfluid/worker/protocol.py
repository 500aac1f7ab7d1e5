"""Link W: the messages between daemon and worker, typed records in the frame envelope
(link/conn.py carries them; net/transport.py reads the socketpair).

Handshake: the daemon sends HELLO {versions, settings} (the worker's WorkerSettings: the
model, runtime and sizes; nothing else configures a worker); the worker loads the model
and answers HELLO_ACK {version, info, kv} (or ERROR). Then STEP (a StepPlan) ->
STEP_RESULT, one at a time, until SHUTDOWN."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..link.conn import HELLO, HELLO_ACK, Protocol
from ..link.records import Record, Table
from ..plan import StepPlan, StepResult

# 2: a lane open carries its prefix-cache namespace and whether its output may be kept on disk
VERSION = 2


class Msg(enum.IntEnum):
    HELLO = HELLO
    HELLO_ACK = HELLO_ACK
    STEP = 3
    STEP_RESULT = 4
    ERROR = 5
    SHUTDOWN = 6


@dataclass(frozen=True, slots=True)
class WorkerSettings(Record):
    """Everything a worker process is configured with, sent once in HELLO."""
    model: str
    lanes: int
    ctx: int
    threads: int
    batch_tokens: int
    runtime: str = "llamacpp"
    load_timeout_s: float = 300.0  # the daemon's wait for HELLO_ACK
    stages: tuple[tuple[str, int], ...] = ()  # the pipeline runtime's stage nodes, (host, port)
    spares: tuple[tuple[str, int], ...] = ()  # stage nodes that stand in for unreachable ones
    stage_psk: bytes | None = None  # their fleet token's PSK (over the socketpair: never in argv)
    split: str = "even"  # how the stages share the layers: even or memory
    rpc_nodes: tuple[tuple[str, int], ...] = ()  # llama.cpp RPC nodes the model is split over (stage_psk)
    rpc_split: tuple[float, ...] = ()  # their shares of the layers, this host's CPU first (): by memory
    rpc_output: str = "head"  # the output layer: on this host's CPU (head) or the last node (last)
    rope_scaling: str = ""  # none, linear or yarn ("": the model's own rope settings)
    rope_scale: float = 0.0  # the stretch over the trained window (0: derived from ctx, runtime/rope.py)
    yarn_orig_ctx: int = 0  # the window yarn stretches (0: the model's trained one)
    rpc_names: tuple[str, ...] = ()  # RPC nodes that join by name; "auto": every one that joins
    rpc_listen_fd: int = -1  # the daemon's socket they join on, inherited (-1: none)
    pooling: str | None = None  # llama.cpp embeddings: mean, cls or last (None: the GGUF's)
    kv_dir: str = ""  # the disk tier of the KV cache ("" : none)
    kv_disk_mb: float = 0.0  # its size cap
    draft_model: str = ""  # a small GGUF of the same vocabulary that drafts for speculation ("": none)
    speculative: str = ""  # "suffix": the runtime drafts from suffix trees (runtime/suffix.py), else prompt lookup
    kv_bits: int = 16  # the KV cache's cells: 16 (f16), 8 (q8_0) or 4 (q4_0), llama.cpp only
    n_cpu_moe: int = 0  # the experts of the first N layers in host memory (-1: all), llama.cpp only
    flash_attn: str = "auto"  # llama.cpp's flash attention: auto (llama-server's default), on or off
    swa_cache: str = "full"  # a sliding-window model's cache: full (every position) or window (runtime/memory_fit.py)
    gpu_layers: int = 999  # llama.cpp's n_gpu_layers (runtime/offload.py; no effect on a CPU build)
    devices: tuple[str, ...] = ()  # the devices layers go to, by ggml's names (() : llama.cpp's choice)
    split_mode: str = "layer"  # over several devices: none, layer or row
    tensor_split: tuple[float, ...] = ()  # their shares of the layers


@dataclass(frozen=True, slots=True)
class Hello(Record):
    TYPE = Msg.HELLO
    versions: tuple[int, ...]
    settings: WorkerSettings


@dataclass(frozen=True, slots=True)
class HelloAck(Record):
    TYPE = Msg.HELLO_ACK
    version: int
    info: dict  # runtime.base.ModelInfo.to_wire()
    kv: tuple[tuple[int, bytes], ...] | None = None  # the disk tier's entries (key, int32 tokens); None: no tier
    kv_ns: tuple[str, ...] | None = None  # each entry's prefix-cache namespace (None: all the shared one)
    kv_marks: tuple[tuple[int, ...], ...] | None = None  # each entry's checkpoint marks (runtime/checkpoints.py)


@dataclass(frozen=True, slots=True)
class WorkerError(Record):
    TYPE = Msg.ERROR
    message: str
    code: str | None = None  # the typed error's code (e.g. a pipeline stage that went away)


@dataclass(frozen=True, slots=True)
class Shutdown(Record):
    TYPE = Msg.SHUTDOWN


TABLE = Table({Msg.HELLO: Hello, Msg.HELLO_ACK: HelloAck, Msg.STEP: StepPlan, Msg.STEP_RESULT: StepResult,
               Msg.ERROR: WorkerError, Msg.SHUTDOWN: Shutdown})
# no keepalive: a dead peer is an EOF on the socketpair; a worker that cannot load answers ERROR
LINK_W = Protocol("Link W", VERSION, TABLE, refusal=WorkerError)
