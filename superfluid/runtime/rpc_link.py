"""The head's side of a model split over llama.cpp RPC nodes (`serve --rpc-nodes`), in the
worker process.

Each node (`superfluid node serve --rpc`) is dialed over Link F: the fleet token's
authenticated, encrypted channel. Its HELLO_ACK says what it offers (memory, threads). For
each node a listener on 127.0.0.1 (a port the OS picks) stands in for its RPC server:
llama.cpp's RPC client connects there, and every connection is carried to the node as a
tunnelled stream (transport.Tunnels), which the node hands to its loopback-only ggml server.
No RPC port is reachable from the network, and nothing travels in the clear.

The links run on an event loop in a background thread. A node whose link ends is fatal to
this worker: `fatal(message)` (set by worker/main.py) reports `stage_unavailable` to the
daemon and ends the process, and the daemon starts a new worker, which loads the model on
the nodes that still answer."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelLoadError, SuperfluidError
from ..link import messages as m
from ..net.transport import Doorman, Link, Tunnels

log = logging.getLogger("superfluid.rpc")

DIAL_TIMEOUT = 5.0


JOIN_WAIT = 30.0  # a worker waits this long for the nodes it names (with auto: for the first) to join
MAX_IDLE = 64  # joined nodes held outside the split (each is a link and its keepalives)
SETTLE = 2.0  # auto: the nodes have joined when none more came for this long (a node redials within 1 s)


@dataclass(eq=False)
class RpcNode:
    addr: str
    link: Link
    tunnels: Tunnels
    server: asyncio.Server | None = None
    port: int = 0
    sids: Any = field(default_factory=lambda: itertools.count(1))

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


class RpcNodes:
    """The nodes a worker's model is split over: `addrs` are dialed; `names` (`auto`: any)
    are nodes that join (`node join --rpc`) on the daemon's --fleet-listen socket, which
    each worker inherits as `listen_fd` and accepts on itself, so RPC bytes never cross the
    daemon. The split is sealed once the model loads: a node that joins later is held idle
    until a reload (`POST /v1/models/load` with `reload`) starts a worker that takes it in."""

    def __init__(self, addrs: list[tuple[str, int]], psk: bytes | None, *, names: list[str] | tuple = (),
                 listen_fd: int = -1, timeout: float = DIAL_TIMEOUT):
        self.fatal: Callable[[str], None] = lambda msg: os._exit(75)
        self.lost: str | None = None  # why this worker cannot go on
        self.closing = False
        self.psk, self.timeout = psk, timeout
        self.auto = "auto" in names
        self.names = [x for x in names if x != "auto"]
        self.instance = secrets.token_hex(8)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rpc-links", daemon=True)
        self._thread.start()
        self.nodes: list[RpcNode] = []
        self.refused: list[str] = []  # nodes that did not answer, and why
        self.joined: dict[str, RpcNode] = {}  # by name, before the split is sealed
        self.idle: dict[str, Link] = {}  # nodes that joined but are not in the split
        self.sealed = False
        self._last_join = 0.0
        self._door = Doorman()
        self._listener: asyncio.Server | None = None
        got = self._run(self._connect_all(addrs))
        self.nodes = [n for n in got if n is not None]
        if listen_fd >= 0:
            self._run(self._listen(listen_fd))
            if self.names or self.auto:
                self._await_joins()
        self._run(self._seal())

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _connect_all(self, addrs: list[tuple[str, int]]) -> list[RpcNode | None]:
        return list(await asyncio.gather(*(self._connect(h, p) for h, p in addrs)))

    async def _connect(self, host: str, port: int) -> RpcNode | None:
        addr = f"{host}:{port}"
        try:
            link = await Link.dial(host, port, m.LINK_F, self.psk, self.timeout)
            ack = await link.greet(m.Hello((m.VERSION,), head=self.instance), self.timeout)
        except SuperfluidError as e:  # a wrong fleet token, a peer that is not a node
            self.refused.append(f"{addr}: {e.message}")
            return None
        except (TimeoutError, ConnectionError, OSError) as e:
            self.refused.append(f"{addr}: {type(e).__name__} {e}".strip())
            return None
        if not ack.rpc:
            link.close()
            self.refused.append(f"{addr}: not an RPC node (start it with `superfluid node serve --rpc`)")
            return None
        return await self._stand_in(addr, link)

    async def _stand_in(self, addr: str, link: Link) -> RpcNode:
        """A loopback port in the node's place for llama.cpp, and the link served."""
        node = RpcNode(addr, link, Tunnels(link))
        node.server = await asyncio.start_server(lambda r, w: self._on_local(node, r, w), "127.0.0.1", 0)
        node.port = node.server.sockets[0].getsockname()[1]
        asyncio.ensure_future(self._serve(node))
        return node

    # -- nodes that join -------------------------------------------------------------------
    async def _listen(self, fd: int) -> None:
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        self._listener = await asyncio.start_server(self._on_join, sock=sock)

    def _await_joins(self) -> None:
        """Until every named node has joined and, with auto, at least one has and no more
        came for SETTLE seconds; at most JOIN_WAIT (the model loads on what came)."""
        deadline = time.monotonic() + JOIN_WAIT
        while time.monotonic() < deadline:
            have = set(self.joined)
            named = all(x in have for x in self.names)
            settled = not self.auto or (have and time.monotonic() - self._last_join >= SETTLE)
            if named and settled:
                return
            time.sleep(0.05)

    async def _seal(self) -> None:
        """The split's nodes, in order: dialed ones as given, named ones as named, then any
        other that joined (auto), by name."""
        self.sealed = True
        named = [self.joined[x] for x in self.names if x in self.joined]
        others = [self.joined[x] for x in sorted(self.joined) if x not in self.names]
        self.nodes += named + others
        self.refused += [f"{x}: has not joined (superfluid node join --rpc --name {x})"
                         for x in self.names if x not in self.joined]

    async def _on_join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A node dialed us (`node join --rpc`); we still initiate the secure channel."""
        peer = writer.get_extra_info("peername")
        try:
            with self._door.entry(writer):  # idle sockets cannot lock real nodes out
                link = await Link.accept(reader, writer, m.LINK_F, self.psk, self.timeout, initiator=True)
                ack = await link.greet(m.Hello((m.VERSION,), head=self.instance), self.timeout)
        except (SuperfluidError, TimeoutError, ConnectionError, OSError) as e:
            log.warning("a node at %s could not join: %s", peer, getattr(e, "message", None) or e or type(e).__name__)
            writer.close()
            return
        name = ack.node or f"{peer[0]}:{peer[1]}"
        if not ack.rpc:
            log.warning("node %s joined, but it is not an RPC node (start it with `node join --rpc`)", name)
            link.close()
            return
        wanted = self.auto or name in self.names
        if self.sealed or not wanted or name in self.joined or name in self.idle:
            await self._hold(name, link, wanted)
            return
        self.joined[name] = await self._stand_in(f"{name} (joined)", link)
        self._last_join = time.monotonic()
        log.info("RPC node %s joined", name)

    async def _hold(self, name: str, link: Link, wanted: bool) -> None:
        """A node that is not in this split: its link is kept alive (it would only redial),
        idle, until it or this worker goes."""
        if name in self.idle or name in self.joined:
            log.warning("a second RPC node joined as %s: names must differ (node join --name)", name)
            link.close()
            return
        if len(self.idle) >= MAX_IDLE:
            log.warning("RPC node %s joined, but %d nodes already wait outside the split: refused", name, MAX_IDLE)
            link.close()
            return
        if wanted:
            log.warning("RPC node %s joined after the model loaded: a reload takes it into the split "
                     "(POST /v1/models/load with \"reload\": true)", name)
        else:
            log.warning("RPC node %s joined, but --rpc-nodes does not name it", name)
        self.idle[name] = link
        try:
            await link.serve(lambda kind, body: None)
        except (SuperfluidError, ConnectionError, OSError):
            pass
        finally:
            link.close()
            if self.idle.get(name) is link:
                del self.idle[name]

    # -- streams ---------------------------------------------------------------------------
    def _on_local(self, node: RpcNode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """llama.cpp's RPC client connected: carry the connection to the node."""
        if node.link.closed:
            writer.close()
            return
        if not own_connection(writer):
            log.warning("refused a connection to the stand-in for %s from another process", node.addr)
            writer.close()
            return
        sid = next(node.sids)
        node.link.send(m.RpcOpen(sid))
        node.tunnels.attach(sid, reader, writer)

    async def _serve(self, node: RpcNode) -> None:
        def on_message(kind: int, body: Any) -> None:
            node.tunnels.on_message(kind, body)  # anything else (NODE_STATUS) is not ours
        why = "its link closed"
        try:
            await node.link.serve(on_message)
        except SuperfluidError as e:
            why = e.message
        except (ConnectionError, OSError) as e:
            why = str(e) or type(e).__name__
        if self.closing:
            return
        if not self.sealed:  # it went before the model loaded: the split goes on without it
            log.warning("the RPC node %s went away before the model loaded (%s)", node.addr, why)
            self.joined = {k: v for k, v in self.joined.items() if v is not node}
            self.nodes = [n for n in self.nodes if n is not node]
            node.tunnels.close()
            if node.server is not None:
                node.server.close()
            return
        self._lose(f"the RPC node {node.addr} went away ({why})")

    def _lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            log.error("%s", why)
        for n in self.nodes:  # llama.cpp's calls to it fail now (ggml aborts: see fatal)
            n.tunnels.close()
            n.link.close()
        self.fatal(why)

    def close(self) -> None:
        self.closing = True

        def stop() -> None:
            for n in self.nodes + list(self.joined.values()):
                n.tunnels.close()
                n.link.close()
                if n.server is not None:
                    n.server.close()
            for link in self.idle.values():
                link.close()
            if self._listener is not None:
                self._listener.close()
            self.loop.stop()
        self.loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=2.0)

    def require(self) -> None:
        """ModelLoadError when no node answered: the model waits for them (the daemon answers
        503 and tries again at the next request)."""
        if not self.nodes:
            raise ModelLoadError("no RPC node answered: " + "; ".join(self.refused or ["none given"]))


def shares(offers: list[tuple[int, int]], split: list[float]) -> list[float]:
    """Each device's share of the layers, this host's CPU first: `split` (--rpc-split) when
    given, else in proportion to each device's free memory (llama.cpp's own rule for
    devices); `offers` are (free, total) bytes per device."""
    if split:
        if len(split) != len(offers) or any(x < 0 for x in split) or sum(split) <= 0:
            raise ModelLoadError(f"--rpc-split needs {len(offers)} non-negative proportions (this host "
                                 f"first, then each node), not {len(split)}")
        w = [float(x) for x in split]
    else:
        w = [float(free) for free, _ in offers]
    total = sum(w) or 1.0
    return [x / total for x in w]


def check_fits(model_bytes: int, offers: list[tuple[int, int]], parts: list[float], names: list[str]) -> None:
    """ModelLoadError when a device's share of the weights is over its free memory: the model
    then waits for the node to come back instead of being loaded where it cannot run."""
    for (free, _), share, name in zip(offers, parts, names, strict=True):
        if free and model_bytes * share > free:
            raise ModelLoadError(f"{name} has {free >> 20} MiB free, less than its share of the model "
                                 f"({int(model_bytes * share) >> 20} MiB)")


def own_connection(writer: asyncio.StreamWriter) -> bool:
    """Is the loopback connection just accepted one of this process's own sockets (llama.cpp's
    RPC client), not another local user's? A stand-in port tunnels to a node's RPC server,
    which has no authentication of its own: only this worker may use it. Linux: the client
    end's socket inode is among this process's descriptors. Elsewhere: True."""
    try:
        peer_port = writer.get_extra_info("peername")[1]
        own_port = writer.get_extra_info("sockname")[1]
        inode = None
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                local, remote = parts[1], parts[2]
                if int(local.split(":")[1], 16) == peer_port and int(remote.split(":")[1], 16) == own_port:
                    inode = parts[9]
                    break
        if inode is None:
            return False
        target = f"socket:[{inode}]"
        return any(_link(f"/proc/self/fd/{fd}") == target for fd in os.listdir("/proc/self/fd"))
    except (OSError, IndexError, TypeError, ValueError):
        return not os.path.exists("/proc/net/tcp")


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:  # a descriptor closed meanwhile
        return None
