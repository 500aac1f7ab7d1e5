"""`superfluid fleet token`, `superfluid node serve` and `superfluid node join`: the fleet's
command-line side. It sits in cli/ with main.py, above the daemon (a node builds its engine through
`daemon.build_engine`), so nothing in fleet/ imports the daemon."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path

from ..config import EngineConfig, home
from ..errors import ModelLoadError, SuperfluidError
from ..link.noise import psk_of
from ..net.loopback import is_loopback_host

log = logging.getLogger("superfluid.node")


def token_path() -> Path:
    return home() / "fleet" / "token"


def fleet_token() -> int:
    """Create <home>/fleet/token (32 random bytes, hex, mode 0600) unless it exists; print it."""
    path = token_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    print(path.read_text().strip())
    return 0


def read_token(path: str) -> bytes:
    """The PSK from a token file. Raises OSError / ValueError with the reason."""
    text = Path(path).expanduser().read_text().strip()
    if len(text) < 16:
        raise ValueError(f"{path} holds no fleet token (create one with `superfluid fleet token`)")
    return psk_of(text)


def rpc_engine(ec: EngineConfig, args, psk: bytes | None) -> EngineConfig | int:
    """The default model's engine split over llama.cpp RPC nodes (`serve --rpc-nodes`): the
    nodes to dial, the names (or `auto`) of nodes that join, and the socket they join on
    (--fleet-listen), bound here and handed to each worker, which accepts them itself."""
    from ..runtime.rpc import RpcUnavailable, library
    dialed, names = args.rpc_nodes
    if ec.runtime != "llamacpp":
        print("superfluid: --rpc-nodes splits a GGUF on llama.cpp; for a Hugging Face model use --pipeline",
              file=sys.stderr)
        return 2
    if names and args.fleet_listen is None:
        print(f"superfluid: --rpc-nodes {','.join(names)}: nodes that join (superfluid node join --rpc) need "
              "--fleet-listen HOST:PORT to join at", file=sys.stderr)
        return 2
    try:
        library()  # a llama-cpp-python built without RPC: say so now, with the fix
    except RpcUnavailable as e:
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 2
    fd = -1
    if args.fleet_listen is not None:
        host, port = args.fleet_listen
        try:
            sock = socket.create_server((host, port), reuse_port=False)
        except OSError as e:
            print(f"superfluid: cannot listen on {host}:{port} (--fleet-listen): {e.strerror}", file=sys.stderr)
            return 1
        _KEEP.append(sock)  # open for the daemon's life: workers come and go, joins queue meanwhile
        fd = sock.fileno()
    return replace(ec, rpc_nodes=tuple(dialed), rpc_names=tuple(names), rpc_listen_fd=fd, stage_psk=psk,
                   rpc_split=tuple(args.rpc_split), rpc_output=args.rpc_output)


_KEEP: list[socket.socket] = []


def node_join(ec: EngineConfig, host: str | None, port: int, token: str | None, auth_file: str | None,
              lease_s: float, *, mdns_interface: str | None = None, name: str | None = None, rpc: bool = False) -> int:
    """A node that dials the head (which still initiates the secure channel); without a
    host, the head is found by mDNS (a head of the same fleet token)."""
    if token is None and auth_file is None and host is not None and not is_loopback_host(host):
        print(f"superfluid: joining a head at {host} needs --token or --auth-file (a fleet token); without one "
              f"only a loopback head may be joined", file=sys.stderr)
        return 2
    try:
        psk = psk_of(token) if token else (read_token(auth_file) if auth_file else None)
    except (OSError, ValueError) as e:
        print(f"superfluid: cannot read --auth-file: {e}", file=sys.stderr)
        return 2
    try:
        if rpc:
            asyncio.run(_rpc(ec, host, port, psk, lease_s, name, join=True, mdns_interface=mdns_interface))
        else:
            asyncio.run(_node(ec, host, port, psk, lease_s, join=True, mdns_interface=mdns_interface, name=name))
    except SuperfluidError as e:
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 1
    return 0


def node_serve(ec: EngineConfig, host: str, port: int, auth_file: str | None, lease_s: float, *,
               name: str | None = None, stage: bool = False, rpc: bool = False) -> int:
    if auth_file is None and not is_loopback_host(host):
        print(f"superfluid: a node listening on {host} needs --auth-file (a fleet token); without one it may only "
              f"listen on loopback", file=sys.stderr)
        return 2
    try:
        psk = read_token(auth_file) if auth_file else None
    except (OSError, ValueError) as e:
        print(f"superfluid: cannot read --auth-file: {e}", file=sys.stderr)
        return 2
    try:
        if rpc:
            asyncio.run(_rpc(ec, host, port, psk, lease_s, name))
        else:
            asyncio.run(_stage(ec, host, port, psk, name) if stage else _node(ec, host, port, psk, lease_s, name=name))
    except SuperfluidError as e:
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"superfluid: cannot listen on {host}:{port}: {e.strerror}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"superfluid: a pipeline stage runs on transformers: pip install 'superfluid[hf]' ({e})",
              file=sys.stderr)
        return 2
    return 0


async def _stage(ec: EngineConfig, host: str, port: int, psk: bytes | None, name: str | None) -> None:
    """A pipeline stage: no engine, the layers a head assigns (on transformers)."""
    import torch  # noqa: F401  (fail here, in one line, when superfluid[hf] is missing)

    from ..fleet.stage_node import StageServer
    try:
        node = StageServer(ec.model_path, ec.model_id, psk, threads=ec.threads, node_id=name)
    except (OSError, ValueError, KeyError) as e:  # converting the GGUF under the home, reading its config
        raise ModelLoadError(f"cannot prepare {ec.model_path} for a pipeline stage: {e}") from None
    server = await node.serve(host, port)
    bound = server.sockets[0].getsockname()
    print(f"superfluid node {node.node_id}: serving {ec.model_id} as a pipeline stage ({node.n_layer} layers) on "
          f"{bound[0]}:{bound[1]} ({'encrypted' if psk else 'plaintext, loopback only'})", flush=True)
    await _until_signal()
    server.close()
    node.close()


async def _rpc(ec: EngineConfig, host: str | None, port: int, psk: bytes | None, lease_s: float, name: str | None,
               *, join: bool = False, mdns_interface: str | None = None) -> None:
    """A llama.cpp RPC node: no model of its own, the layers heads place here. Its ggml
    server computes in this process: its threads wait passively (config.THREAD_ENV), set
    before llama.cpp's OpenMP runtime loads and reads it. With `join` it dials the head
    (`node join --rpc`; the head's --rpc-nodes names it, or says auto)."""
    from ..config import THREAD_ENV, home
    for k, v in THREAD_ENV.items():
        os.environ.setdefault(k, v)
    from ..fleet.rpc_node import RpcNodeServer
    node = RpcNodeServer(psk, str(home() / "rpc-cache"), threads=ec.threads, node_id=name, lease_s=lease_s)
    offer = node.offer()
    what = (f"serving llama.cpp RPC ({offer['free'] >> 20} MiB free, "
            f"{node.threads} thread{'s' if node.threads != 1 else ''})")
    try:
        await _serve_until_signal(node, host, port, psk, join, mdns_interface, what,
                                  "encrypted" if psk else "plaintext, loopback only")
    finally:
        node.close()


async def _serve_until_signal(node, host: str | None, port: int, psk: bytes | None, join: bool,
                              mdns_interface: str | None, what: str, how: str) -> None:
    """A node's life: it serves the heads that dial it (`node serve`) or dials its head
    (`node join`, found by mDNS without an address), until SIGINT / SIGTERM."""
    server = joining = None
    if join:
        joining = asyncio.create_task(node.join(host, port, find=_finder(psk, host, mdns_interface)))
        where = f"the head at {host}:{port}" if host else "a head found by mDNS"
        print(f"superfluid node {node.node_id}: {what} to {where} ({how})", flush=True)
    else:
        assert host is not None
        server = await node.serve(host, port)
        bound = server.sockets[0].getsockname()
        print(f"superfluid node {node.node_id}: {what} on {bound[0]}:{bound[1]} ({how})", flush=True)
    try:
        await _until_signal()
    finally:
        if joining is not None:
            joining.cancel()
        if server is not None:
            server.close()


def _finder(psk: bytes | None, host: str | None, interface: str | None):
    """How a joining node finds its head: by mDNS when no address is given."""
    if host is not None:
        return None
    from ..fleet.discovery import discover

    async def find():
        return await discover(psk, interface=interface)
    return find


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _node(ec: EngineConfig, host: str | None, port: int, psk: bytes | None, lease_s: float, *,
                join: bool = False, mdns_interface: str | None = None, name: str | None = None) -> None:
    from ..daemon import build_engine
    from ..fleet.node import NodeServer

    engine = build_engine(ec)
    await engine.start()
    try:
        node = NodeServer(engine, psk, lease_s=lease_s, node_id=name)
        how = f"{'encrypted' if psk else 'plaintext, loopback only'}; {ec.max_batch} lanes x {engine.n_ctx} tokens"
        await _serve_until_signal(node, host, port, psk, join, mdns_interface, f"serving {engine.model_id}", how)
    finally:
        await engine.close()
