"""Frozen configuration for one `superfluid serve`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .limits import PULL_MAX_BYTES, PULL_MIN_FREE
from .request import Qos

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8453


# llama.cpp built with OpenMP (not superfluid's build: scripts/llama-build.sh turns it off)
# spins at every barrier by default, so with one thread per core anything else that runs made
# decode 30-50x slower (NOTES.md); its threads wait passively here. An operator's own
# OMP_WAIT_POLICY wins. ggml's own threadpool, which superfluid builds, ignores it: the
# worker gives it fewer threads while other processes keep cores busy (runtime/threads.py).
THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def default_threads() -> int:
    """Every core this process may run on (its CPU affinity: a container's share)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def home() -> Path:
    return Path(os.environ.get("SUPERFLUID_HOME", "~/.superfluid")).expanduser()


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can list or enter (0700), made if missing. What
    the daemon keeps (sessions, KV, pid files, logs) is other users' business in none of it;
    an existing directory we do not own keeps its mode."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.chmod(path, 0o700)
    except PermissionError:
        pass
    return path


def private_file(path: Path, *, create: bool = False) -> None:
    """A file only its owner can read or write (0600): made so with `create`, else if it exists."""
    if create:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    try:
        os.chmod(path, 0o600)
    except (FileNotFoundError, PermissionError):
        pass


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    model_id: str
    max_batch: int = 8
    max_context: int | None = None  # None: the model's trained window, capped to fit memory
    threads: int = 1
    step_tokens: int = 512  # most tokens in one step (decodes first, then prefill chunks): llama.cpp's micro-batch
    max_respawns: int = 3
    max_queue: int = 512  # generations waiting for a lane; more get 503 queue_full (Ollama's default)
    max_output: int | None = None  # most tokens one generation produces, whatever it asks (None: the window's room)
    kv_slots: int | None = None  # KV sequences in the worker (None: 2 x max_batch); extra ones cache prefixes
    class_lanes: tuple[tuple[int, int], ...] = ()  # (qos, most lanes) caps
    aging_steps: int = 256  # a waiting job rises one QoS class every this many steps
    step_target_s: float = 0.25  # prefill chunks are sized so a step takes about this long
    chat_template: str | None = None  # a jinja chat template used instead of the models' own
    tool_dialect: str | None = None  # the tool-call dialect (codec/dialects/) instead of the detected one
    runtime: str = "llamacpp"  # the worker's runtime: llamacpp, transformers, or pipeline (over stages)
    stages: tuple = ()  # pipeline: the stage nodes (host, port), in layer order
    stage_spares: tuple = ()  # pipeline: stage nodes that take the place of a lost one
    stage_psk: bytes | None = None  # pipeline: the fleet token's PSK for the stage links
    stage_split: str = "even"  # pipeline: layers split evenly or by the memory each stage reports
    rpc_nodes: tuple = ()  # llama.cpp RPC nodes (host, port) the GGUF is split over (stage_psk: their token)
    rpc_split: tuple = ()  # the layers' proportions: this host's CPU first, then each node (): by memory
    rpc_output: str = "head"  # the output layer: on this host's CPU (head) or the last node (last)
    rope_scaling: str = ""  # none, linear or yarn: stretch the positions past the trained window ("": the model's)
    rope_scale: float = 0.0  # the stretch (1/rope_freq_scale); 0: derived from the window (runtime/rope.py)
    yarn_orig_ctx: int = 0  # the window yarn stretches (0: the model's trained one)
    rpc_names: tuple = ()  # RPC nodes that join (node join --rpc) by --name; "auto": every one that joins
    rpc_listen_fd: int = -1  # the socket they join on (--fleet-listen), inherited by each worker
    pooling: str | None = None  # embeddings on llama.cpp: mean, cls or last (None: the GGUF's, else mean)
    matryoshka: bool = False  # embeddings may be cut to `dimensions` (a model trained for it)
    kv_dir: str = ""  # the disk tier of the KV cache ("": none); each model file gets its own folder in it
    kv_disk_mb: float = 0.0  # its size cap
    speculative: str = "off"  # "ngram": decode runs verify drafts looked up in the lane's own context; "suffix":
    # drafts from suffix trees over the lane's context and earlier outputs; "draft": a second, small model's
    spec_max_tokens: int = 8  # most drafts a lane verifies in one step
    stream_interval_ms: int = 50  # a stream's tokens are committed and sent at most this often (engine/delivery.py)
    decode_steps: int = 4  # most forwards one plan of decodes alone runs (sched/multistep.py); 1: one a plan
    draft_model: str = ""  # --speculative draft: the draft model's GGUF (same vocabulary)
    sampling: tuple[tuple[str, float], ...] = ()  # the operator's sampling defaults (engine/sampling_defaults.py)
    kv_bits: int = 16  # --kv-bits: the KV cache's cells, 16 (f16), 8 (q8_0) or 4 (q4_0); llama.cpp only
    flash_attn: str = "auto"  # --flash-attn: auto (llama-server's default), on or off
    n_cpu_moe: int = 0  # --n-cpu-moe: the experts of the first N layers stay in host memory (-1: every layer's)
    # --swa-cache: a sliding-window model's cache, full-size (every position: cut anywhere), window-sized
    # (its prefix cache is then state checkpoints) or auto (full where it fits: runtime/memory_fit.py)
    swa_cache: str = "auto"
    # --gpu-layers: auto (fitted to the devices' memory: runtime/offload.py), all, or a number;
    # the daemon resolves auto to a number before the worker starts
    gpu_layers: str = "auto"
    devices: tuple[str, ...] = ()  # --device: ggml's device names (() : every GPU; ("none",): the CPU)
    split_mode: str = "layer"  # --split-mode over several GPUs: none, layer or row
    tensor_split: tuple[float, ...] = ()  # --tensor-split: the devices' shares of the layers
    # --deterministic: no prefill run of one row (with flash attention off, every other run
    # computes a row the same way: sched/scheduler.py `tail_rows`)
    deterministic: bool = False

    @property
    def spec_tokens(self) -> int:
        """Most drafts a lane verifies in a step by default (0: no speculation)."""
        return self.spec_max_tokens if self.speculative in ("ngram", "suffix", "draft") else 0

    @property
    def slots(self) -> int:
        return self.kv_slots or 2 * self.max_batch


@dataclass(frozen=True)
class ServeConfig:
    engine: EngineConfig
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = 16 * 1024 * 1024
    default_qos: Qos = Qos.AGENT
    policies: tuple = ()  # api.policy.KeyPolicy entries; empty: no key needed
    ip_rpm: int | None = None  # per-client requests per minute
    log_format: str = "text"  # or "json"
    tui: bool = False  # the live monitor instead of scrolling logs
    drain_timeout: float = 300.0  # SIGUSR1: how long running requests may take to finish
    models: tuple = ()  # runtime.registry.ModelSource: the first is the default
    model_dir: str | None = None  # more models, loaded on their first request
    idle_timeout: float | None = None  # unload a non-default model idle this long
    sessions_dir: str | None = None  # the session store's directory (None: <home>/sessions)
    sessions_cache: bool = False  # a throwaway in-memory store: nothing persists
    resume_grace: float = 0.0  # a dropped stream keeps generating this long (0: cut at once, resumed from the log)
    store_max_bytes: int | None = None  # the session store's cap (retention keeps it under; then 507s)
    fleet: tuple = ()  # (host, port) of nodes the head dials; the default model runs on them
    fleet_psk: bytes | None = None  # SHA-256 of the fleet token (None: plaintext, loopback only)
    fleet_policy: str = "load-aware"
    fleet_timeout: float = 5.0  # a node silent this long is gone
    fleet_grace: float = 1.0  # a gone node's generations move after this long
    fleet_listen: tuple | None = None  # (host, port) where nodes join the head
    fleet_local: bool = False  # the head also serves its default model as one of the nodes
    fleet_mdns: bool = True  # advertise --fleet-listen on mDNS (_superfluid-fleet._tcp)
    ui: bool = True  # the web app at / and /monitor
    embedding_model: str | None = None  # the model id embedding requests without a model go to
    cors_origins: tuple[str, ...] = ()  # browser origins let in besides this machine's own pages
    allow_model_paths: bool = False  # an admin key may load a model file by its path
    pull_max_bytes: int = PULL_MAX_BYTES  # a pull the daemon runs: its files in all (runtime/pull_bounds.py)
    pull_min_free: int = PULL_MIN_FREE  # ... and the bytes it leaves free on the hub cache's disk
    aliases: tuple = ()  # --alias: (name, model id or None for the default model)
    strict_models: bool = False  # a model name we do not serve is a 404 even when one model is served
    max_connections: int = 1024  # open HTTP connections; more get a 503 (net/http.py)
    header_timeout: float = 30.0  # seconds to send a request's headers (slowloris)
    sessions_max_age: float | None = None  # seconds: idle sessions older than this are erased
    cache_isolation: bool = True  # each API key its own prefix-cache namespace (api/cache_ns.py)
