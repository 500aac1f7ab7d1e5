"""The daemon's composition root: build() wires the model registry, the service and its
session log, the engines (each given its session log, metrics hooks and clock), the store,
the metrics and the HTTP app, all by constructor; serve() is build() plus uvicorn and the
signals. Tests build() with a fake engine factory and drive App.asgi in process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import uvicorn

from . import __version__
from .api.app import create_app
from .api.listener import Prover, write_token
from .codec.tokenizer import Tokenizer
from .config import EngineConfig, ServeConfig, home, private_dir
from .errors import ModelLoadError
from .engine import NO_HOOKS, Engine, EngineAPI, Hooks, SessionLog
from .monitor.access import AccessLog
from .monitor.metrics import Metrics
from .net.http import open_files_room, protocol
from .net.loopback import is_loopback_host
from .runtime import suffix_store
from .runtime.pull_bounds import Bounds
from .runtime import devices, offload
from .runtime.devices import Build
from .runtime.memory_fit import MemoryShape, fit
from .runtime.registry import (available_memory, default_runtime, is_hf_folder,
                               model_bytes, suffix_dir)
from .runtime.rope import derive, describe, trained_window
from .service import Sessions
from .service.registry import Models
from .service.retention import Retention
from .session.store import Store

Clock = Callable[[], float]
EngineFactory = Callable[[EngineConfig, SessionLog, Hooks, Clock], EngineAPI]
ASGIApp = Any  # an ASGI callable (the access log around the FastAPI app)

log = logging.getLogger("superfluid")


def listen_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGINT/SIGTERM after its shutdown, which would skip stopping the
    worker; we take the signals ourselves and exit 0 after a clean stop. SIGUSR1 drains:
    no new connections, running requests get up to drain_timeout to finish."""

    drain_timeout = 300.0
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    @contextlib.contextmanager
    def capture_signals(self):
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in self.SIGNALS:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGUSR1:
            log.info("draining: no new requests; running ones have %.0f s to finish", self.drain_timeout)
            self.config.timeout_graceful_shutdown = int(self.drain_timeout)
        elif self.should_exit:
            self.force_exit = True  # a second Ctrl-C: stop waiting for open streams
        self.should_exit = True


def pidfile_path(port: int):
    return home() / "run" / f"serve-{port}.pid"


def write_pidfile(port: int):
    """<home>/run/serve-PORT.pid, for `superfluid stop`."""
    path = pidfile_path(port)
    private_dir(home())
    private_dir(path.parent)
    path.write_text(f"{os.getpid()}\n")
    return path


def tokenizer_for(path: str):
    """The GGUF's vocabulary through llama.cpp, or a Hugging Face folder's tokenizer.json."""
    if is_hf_folder(path):
        from .codec.hf_tokenizer import HfTokenizer
        return HfTokenizer(path)
    return Tokenizer(path)


def build_engine(ec: EngineConfig, log: SessionLog | None = None, *, hooks: Hooks = NO_HOOKS,
                 clock: Clock = time.monotonic) -> Engine:
    tok = tokenizer_for(ec.model_path)
    trained = tok.shape.n_ctx_train
    # an explicit --rope-scale stretches the default window too; the worker applies the same
    # derivation (runtime/rope.py), this one only sizes the window and says what it serves
    got = fit(memory_shape(ec.model_path, tok), requested=ec.max_context,
              n_ctx_train=trained_window(trained, ec.rope_scale, ec.yarn_orig_ctx), lanes=ec.slots,
              kv_bits=ec.kv_bits, model_bytes=model_bytes(ec.model_path), mem_bytes=available_memory(),
              swa_cache=ec.swa_cache, rollback=ec.speculative != "off")
    if got.swa_cache != ec.swa_cache:
        ec = replace(ec, swa_cache=got.swa_cache)  # auto, decided: the worker is told which
    off = None
    if ec.runtime == "llamacpp":  # the layers and window on the GPU, where the build has one
        try:
            off = offload.plan(machine(), gpu_layers=ec.gpu_layers, names=ec.devices, n_layer=tok.shape.n_layer,
                               model_bytes=model_bytes(ec.model_path), fit=got, lanes=ec.slots,
                               requested=ec.max_context)
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        ec = replace(ec, gpu_layers=str(off.layers))
        if off.line:
            logging.getLogger("superfluid").info("%s: %s", ec.model_id, off.line)
    n_ctx = off.n_ctx if off is not None else got.n_ctx
    say_window(ec, n_ctx, trained)
    eng = Engine(ec, tok, n_ctx, log, hooks=hooks, clock=clock)
    eng.offload = off
    return eng


def machine() -> Build:
    """The llama.cpp build and the devices it sees now (runtime/devices.py): asked of a
    short-lived process where the build has a GPU backend, so the daemon holds no device."""
    names = devices.backends()
    return devices.probe() if set(names) & devices.GPU_BACKENDS else devices.here()


def memory_shape(path: str, tok) -> MemoryShape:
    """What a token and a lane of the model cost (runtime/memory_fit.py): from a GGUF's header,
    every layer's KV for a Hugging Face folder."""
    if is_hf_folder(path):
        return MemoryShape(full_token=tok.shape.kv_bytes_per_token)
    return MemoryShape.of_gguf(path, tok.shape.kv_bytes_per_token)


def say_window(ec: EngineConfig, n_ctx: int, trained: int) -> None:
    """One line on a window past the trained one or a rope scaling asked for: what the
    positions are stretched by, or a warning that quality degrades where they are not."""
    if ec.runtime not in ("llamacpp", "transformers"):  # the runtimes that generate and stretch positions
        return
    said = describe(derive(ec.rope_scaling, ec.rope_scale, ec.yarn_orig_ctx, n_ctx=n_ctx, n_ctx_train=trained), n_ctx)
    if said is not None:
        (log.warning if said[1] else log.info)("%s: %s", ec.model_id, said[0])


def store_of(cfg: ServeConfig) -> Store:
    """The session store the settings name, not opened yet (build() opens it): a throwaway
    in-memory one with --sessions-cache."""
    if cfg.sessions_cache:
        return Store(None)
    return Store(cfg.sessions_dir or str(home() / "sessions"), max_bytes=cfg.store_max_bytes)


def fleet_engines(cfg: ServeConfig, store: Store) -> EngineFactory:
    """The head's engine for the default model: the tokenizer and template from the local
    GGUF, generations on the fleet's nodes. Epochs start above every earlier run's
    (the store's epoch, bumped at every start, in the high bits)."""
    from .fleet.head import FleetEngine
    from .fleet.pool import NodePool

    async def local() -> Engine:
        eng = build_engine(cfg.engine)
        await eng.start()
        return eng

    pool = NodePool(list(cfg.fleet), cfg.fleet_psk, timeout=cfg.fleet_timeout, epoch_floor=store.epoch << 32,
                    listen=cfg.fleet_listen, mdns=cfg.fleet_mdns, local=local if cfg.fleet_local else None)

    def build(ec: EngineConfig, log: SessionLog, hooks: Hooks, clock: Clock) -> EngineAPI:
        """The default model, and any other model a connected node serves, runs on the
        fleet; the rest run here."""
        if ec.model_id != cfg.engine.model_id and not pool.serves(ec.model_id):
            return build_engine(ec, log, hooks=hooks, clock=clock)
        tok = tokenizer_for(ec.model_path)
        return FleetEngine(ec, tok, tok.shape.n_ctx_train or 4096, pool, policy=cfg.fleet_policy,
                           grace=cfg.fleet_grace, log=log, hooks=hooks)
    return build


async def advertise_rpc(cfg: ServeConfig):
    """Where RPC nodes join (`serve --rpc-nodes auto|NAME --fleet-listen`), on mDNS, so
    `node join --rpc` finds this head without its address."""
    fd = cfg.engine.rpc_listen_fd
    if fd < 0 or not cfg.fleet_mdns:
        return None
    from .fleet.discovery import Advertiser
    with socket.socket(fileno=os.dup(fd)) as s:
        host, port = s.getsockname()[:2]
    return await Advertiser.start(host, port, cfg.fleet_psk)


def local_engines(cfg: ServeConfig) -> EngineFactory:
    """Engines on this machine, each with its own worker process."""
    def build(ec: EngineConfig, log: SessionLog, hooks: Hooks, clock: Clock) -> EngineAPI:
        if ec.model_id != cfg.engine.model_id:  # a pipeline or an RPC split serves the default model only
            if ec.stages:
                ec = replace(ec, runtime=default_runtime(ec.model_path), stages=(), stage_spares=())
            ec = replace(ec, rpc_nodes=(), rpc_names=(), rpc_listen_fd=-1, rpc_split=())
        return build_engine(ec, log, hooks=hooks, clock=clock)
    return build


@dataclass
class App:
    """A daemon, built: the ASGI app (access log outermost) over the models it serves, the
    session log every engine commits to, and the metrics. start() loads the models."""
    cfg: ServeConfig
    asgi: ASGIApp
    models: Models
    sessions: Sessions
    metrics: Metrics
    store: Store
    retention: Retention

    async def start(self) -> None:
        await self.models.start([src.id for src in self.cfg.models])

    async def close(self) -> None:
        await self.models.close()
        await asyncio.sleep(0)  # let the engines' last log writes reach the store's queue


def build(cfg: ServeConfig, *, store: Store, engine_factory: EngineFactory | None = None,
          clock: Clock = time.monotonic) -> App:
    """The composition root: everything a daemon is, wired by constructor. `store` is opened
    here (StoreLocked / StoreUnreadable name the directory); `engine_factory` makes an engine
    for a model's settings (default: local workers, or the fleet's nodes with --fleet /
    --fleet-listen); `clock` is what idle time, pins and the resume grace are read on. Nothing loads until
    App.start()."""
    engines: dict[str, EngineAPI] = {}
    metrics = Metrics(engines)
    store.open(on_commit=metrics.commit.observe)
    try:
        sessions = Sessions(store, grace=cfg.resume_grace, clock=clock)
        if cfg.engine.kv_dir:
            sessions.forget_outputs = forgetter(suffix_dir(cfg.engine.kv_dir))
        if engine_factory is None:
            engine_factory = fleet_engines(cfg, store) if cfg.fleet or cfg.fleet_listen else local_engines(cfg)
        make = engine_factory

        def engine(ec: EngineConfig) -> EngineAPI:
            return make(ec, sessions, metrics.hooks(ec.model_id), clock)

        models = Models(cfg.engine, engine, idle_timeout=cfg.idle_timeout, sessions=sessions,
                        embedding=cfg.embedding_model, strict=cfg.strict_models, engines=engines, clock=clock)
        models.pull_bounds = Bounds(cfg.pull_max_bytes, cfg.pull_min_free)
        retention = Retention(sessions, lambda sid: any(e.pinned(sid) for e in engines.values()),
                              cfg.sessions_max_age, cfg.store_max_bytes, on_erased=metrics.pruned.inc)
        for src in cfg.models:
            models.add(src)
        if cfg.model_dir:
            models.add_dir(cfg.model_dir)
        for name, target in cfg.aliases:
            models.alias(name, target)
        app = create_app(models, max_body=cfg.max_body_bytes, default_qos=cfg.default_qos,
                         metrics_registry=metrics.registry, policies=list(cfg.policies),
                         loopback_bind=is_loopback_host(cfg.host), ip_rpm=cfg.ip_rpm, ui=cfg.ui,
                         cors_origins=cfg.cors_origins, allow_model_paths=cfg.allow_model_paths,
                         cache_isolation=cfg.cache_isolation, bind_host=cfg.host,
                         retention=retention)
        logged = AccessLog(app, cfg.log_format, on_record=metrics.observe_request,
                           skip=frozenset({"/health", "/metrics", "/v1/monitor"}))  # polled each second, like /metrics
    except BaseException:
        store.close()
        raise
    return App(cfg, logged, models, sessions, metrics, store, retention)



def forgetter(folder) -> Callable[[float], Awaitable[None]]:
    """An erasure's reach into the suffix drafter's files (every model's, in `folder`): the
    outputs of lanes opened before the time given (runtime/suffix_store.forget_before)."""
    async def forget(cutoff: float) -> None:
        try:
            n = await asyncio.to_thread(suffix_store.forget_before, folder, cutoff)
        except OSError as e:
            log.error("an erasure could not reach the suffix drafter's files in %s: %s", folder, e)
            return
        if n:
            log.info("erased %d kept output(s) from the suffix drafter's files", n)
    return forget


def say_build() -> None:
    """The daemon's first line: the llama.cpp build it runs on (backends, the CPU's instruction
    sets, the devices layers go to), and a warning when the machine has a GPU the build lacks."""
    try:
        build = machine()
        log.info("%s", build.line())
        said = devices.missing_gpu_line(build)
    except OSError as e:  # a llama-cpp-python whose libraries are not where it keeps them
        log.warning("cannot read llama.cpp's backends: %s", e)
        return
    if said:
        log.warning("%s", said)


async def serve(daemon: App, sock: socket.socket) -> None:
    """build() plus uvicorn: load the models, serve until a signal, stop."""
    cfg, models = daemon.cfg, daemon.models
    say_build()
    advert = await advertise_rpc(cfg)  # before the model loads: its worker waits for nodes to join
    try:
        await daemon.start()
    except BaseException:
        if advert is not None:
            await advert.close()
        raise
    engines = models.engines
    assert models.default is not None
    engine = engines[models.default]
    host, port = sock.getsockname()[:2]
    http = protocol(open_files_room(cfg.max_connections), cfg.header_timeout)
    # the CLI's proof that this listener is the user's own server (api/listener.py)
    token_file, token = write_token(port)
    # log_config None: uvicorn's own lines (an unhandled exception's traceback) go through the
    # queued writer (monitor/logs.py) like every other line, not straight to stderr from the event
    # loop, where a full pipe (a parent that does not read it) froze the daemon for good
    server = _Server(uvicorn.Config(Prover(daemon.asgi, token), log_level="warning", access_log=False, log_config=None,
                                    timeout_graceful_shutdown=3, lifespan="off", http=http))
    server.drain_timeout = cfg.drain_timeout
    shown = f"[{host}]" if ":" in host else host
    others = f" (+{len(models.sources) - 1} more)" if len(models.sources) > 1 else ""
    if cfg.fleet or cfg.fleet_listen:
        joins = f", nodes join at {cfg.fleet_listen[0]}:{cfg.fleet_listen[1]}" if cfg.fleet_listen else ""
        crypto = "encrypted" if cfg.fleet_psk else "plaintext (loopback)"
        where = f"on a fleet of {len(cfg.fleet)} dialed node(s){joins}, {crypto}"
    else:
        where = (f"{cfg.engine.max_batch} lanes, {cfg.engine.slots} KV slots x {engine.n_ctx} tokens, "
                 f"{cfg.engine.threads} thread{'s' if cfg.engine.threads != 1 else ''}")
    print(f"superfluid {__version__}: serving {engine.model_id}{others} on http://{shown}:{port} ({where})",
          flush=True)
    monitor = None
    if cfg.tui:  # imported here: rich adds ~25 ms to the start of a daemon without a terminal
        from .monitor.tui import Dashboard, LiveMonitor, LogBuffer
        monitor = LiveMonitor(Dashboard(engines, f"http://{shown}:{port}", LogBuffer()))
        monitor.start()
    pidfile = write_pidfile(port)
    reaper = asyncio.create_task(models.reap_idle())
    retention = asyncio.create_task(daemon.retention.run())
    try:
        await server.serve(sockets=[sock])
    finally:
        reaper.cancel()
        retention.cancel()
        if advert is not None:
            await advert.close()
        if monitor is not None:
            monitor.stop()
        await daemon.close()
        pidfile.unlink(missing_ok=True)
        token_file.unlink(missing_ok=True)
        log.info("stopped")


def run(daemon: App, sock: socket.socket) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(daemon, sock))
    finally:
        daemon.store.close()
