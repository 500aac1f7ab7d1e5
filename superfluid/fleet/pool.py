"""The head's links to its fleet nodes, shared by every model the head serves on the fleet.

Nodes are dialed (`--fleet`), join (`--fleet-listen`, found by mDNS or named), or run in
this process (`--fleet-local`: the head's own model, behind a loopback Link F like any other
node). The pool dials with backoff; each link (net/transport.py) keeps itself alive (KEEPALIVE
every second, which also renews the node's leases, idle or not) and treats a node silent
for `timeout` as gone. The pool routes each node's messages to the FleetEngine whose generation they belong to.
Command ids and epochs come from one counter for the whole head (never reused: the
session store's epoch is in their high bits)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import SuperfluidError, WorkerUnavailable
from ..link import messages as m
from ..link.head_state import Counter
from ..link.noise import AuthFailed
from ..net.transport import Doorman, Link
from .prefixes import from_wire

log = logging.getLogger("superfluid.fleet")

RECENT = 5.0  # a prompt placed on a node counts as held there this long before its reports show it
START_WAIT = 120.0  # a head that dials nodes waits this long for the first one


@dataclass(eq=False)
class NodeConn:
    """The head's view of one node."""
    host: str
    port: int  # 0: the node joined (it dialed us); host is then its name
    up: bool = False
    link: Link | None = None
    name: str = ""
    models: list[m.ModelOffer] = field(default_factory=list)
    status: dict = field(default_factory=dict)  # its last NodeStatus report, as sent
    prefixes: frozenset = frozenset()  # prefix hashes it holds (fleet/prefixes.py): NODE_PREFIXES + recent
    recent: dict = field(default_factory=dict)  # hash -> when the head placed a prompt holding it here
    refused: str | None = None  # why the node refused us (a wrong token), logged once

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}" if self.port else f"{self.host} (joined)"

    def set_prefixes(self, body: dict) -> None:
        now = time.monotonic()
        self.recent = {h: t for h, t in self.recent.items() if now - t < RECENT}
        self.prefixes = from_wire(body) | frozenset(self.recent)

    def placed_prompt(self, hashes: list[int]) -> None:
        """The head placed a prompt here: its prefix counts as held until the node's next
        reports would show it (a turn that follows at once finds this node warm)."""
        now = time.monotonic()
        self.recent.update(dict.fromkeys(hashes, now))
        self.prefixes = self.prefixes | frozenset(hashes)

    def window(self, model_id: str) -> int:
        return max((x.n_ctx for x in self.models if x.id == model_id), default=0)

    def serves(self, model_id: str) -> bool:
        return any(x.id == model_id for x in self.models)

    def embed_window(self, model_id: str) -> int:
        return max((x.embed_window for x in self.models if x.id == model_id), default=0)


class NodePool:
    def __init__(self, nodes: list[tuple[str, int]], psk: bytes | None, *, timeout: float = 5.0,
                 epoch_floor: int = 0, listen: tuple[str, int] | None = None, mdns: bool = True,
                 local: Callable[[], Awaitable[Any]] | None = None):
        self.nodes = [NodeConn(h, p) for h, p in nodes]
        self.psk = psk
        self.timeout = timeout
        self.proto = replace(m.LINK_F, silence=timeout)  # a node silent this long is treated as gone
        self.listen_at = listen
        self.mdns = mdns
        self.instance = secrets.token_hex(8)  # this head process: the namespace of its command ids on nodes
        self.epochs = Counter(epoch_floor)
        self.cmds = Counter(epoch_floor)
        self.engines: list = []  # the FleetEngines placing work here
        self._local = local  # builds and starts the head's own engine, served as a node
        self._local_engine: Any = None
        self._local_node: Any = None
        self._local_server: asyncio.Server | None = None
        self._server: asyncio.Server | None = None
        self._door = Doorman()  # nodes mid-handshake on --fleet-listen
        self._advert: Any = None
        self._bg: list[asyncio.Task] = []
        self._started: asyncio.Task | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def ready(self, model_id: str | None = None) -> bool:
        return any(n.up and (model_id is None or n.serves(model_id)) for n in self.nodes)

    def serves(self, model_id: str) -> bool:
        return self.ready(model_id)

    async def start(self) -> None:
        """Once for the head (every engine awaits the same start)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        if self._local is not None:
            await self._serve_local()
        if self.listen_at is not None:
            self._server = await asyncio.start_server(self._on_join, *self.listen_at)
            if self.mdns:
                from .discovery import Advertiser
                bound = self._server.sockets[0].getsockname()
                self._advert = await Advertiser.start(self.listen_at[0], bound[1], self.psk)
        self._bg += [asyncio.create_task(self._run_node(n), name=f"fleet-{n.addr}") for n in self.nodes]
        if not self.nodes:
            return  # nodes join when they will; requests get 503 until one has
        deadline = time.monotonic() + START_WAIT
        while not self.ready() and time.monotonic() < deadline:
            if all(n.refused for n in self.nodes):
                break
            await asyncio.sleep(0.1)
        if not self.ready():
            why = "; ".join(f"{n.addr}: {n.refused or 'no answer'}" for n in self.nodes)
            await self.close()
            raise WorkerUnavailable(f"no fleet node is reachable ({why})")

    async def _serve_local(self) -> None:
        """The head's own model as one more node: a NodeServer on a loopback port in this
        process, dialed like the others (so failover, fencing and reconcile are the same)."""
        from .node import NodeServer
        assert self._local is not None
        self._local_engine = await self._local()
        self._local_node = NodeServer(self._local_engine, self.psk, node_id="head (local)")
        self._local_server = await self._local_node.serve("127.0.0.1", 0)
        self.nodes.insert(0, NodeConn("127.0.0.1", self._local_server.sockets[0].getsockname()[1]))

    def attach(self, engine) -> None:
        self.engines.append(engine)

    async def detach(self, engine) -> None:
        if engine in self.engines:
            self.engines.remove(engine)
        if not self.engines:
            await self.close()

    async def close(self) -> None:
        for t in self._bg:
            t.cancel()
        self._bg = []
        if self._advert is not None:
            advert, self._advert = self._advert, None
            try:
                await advert.close()
            except Exception as e:  # the links and the local engine must still close
                log.warning("mDNS withdrawal failed: %s", e)
        if self._server is not None:
            self._server.close()
        for n in self.nodes:
            if n.link is not None:
                n.link.close()
        if self._local_server is not None:
            self._local_server.close()
            self._local_node.close()
            await self._local_engine.close()
            self._local_server = None

    def send(self, node: NodeConn, msg: Any) -> None:
        """A typed message to a node (dropped when its link is down: reconcile covers it)."""
        if node.link is None:
            return
        try:
            node.link.send(msg)
        except ConnectionError:
            pass

    def cancel(self, node: NodeConn, gen: str) -> None:
        self.send(node, m.GenerateCancel(self.cmds.next(), gen))

    # -- the links -------------------------------------------------------------------------
    async def _greet(self, link: Link) -> m.HelloAck:
        return await link.greet(m.Hello((m.VERSION,), self.instance))

    async def _run_node(self, n: NodeConn) -> None:
        backoff = 0.1
        while True:
            try:
                link = await Link.dial(n.host, n.port, self.proto, self.psk)
                ack = await self._greet(link)
            except AuthFailed as e:
                self._refused(n, e.message)
                await asyncio.sleep(min(backoff, 5.0))
                backoff *= 2
                continue
            except (TimeoutError, ConnectionError, OSError, SuperfluidError) as e:
                if isinstance(e, ConnectionError) and "handshake" in str(e):
                    self._refused(n, "it closed the connection during the handshake: --fleet-auth and the node's "
                                     "--auth-file differ")
                if isinstance(e, ConnectionRefusedError):  # nothing listens there: the node is down, not cut off
                    for eng in self.engines:
                        eng.node_lost(n, at=0.0)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            await self._session(n, link, ack)

    async def _join_handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        link = await Link.accept(reader, writer, self.proto, self.psk, initiator=True)
        return link, await self._greet(link)

    async def _on_join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A node that joins (`superfluid node join`): the head still initiates the secure
        channel; a node that joins again under the same name gets its generations back."""
        peer = writer.get_extra_info("peername")
        try:
            with self._door.entry(writer):  # idle sockets cannot lock real nodes out
                link, ack = await asyncio.wait_for(self._join_handshake(reader, writer), self._door.deadline)
        except AuthFailed as e:
            log.error("a node at %s refused the fleet token: %s", peer, e.message)
            writer.close()
            return
        except (TimeoutError, ConnectionError, OSError, SuperfluidError) as e:
            if isinstance(e, ConnectionError) and "handshake" in str(e):
                log.error("a node at %s refused the fleet token: the node's token and --fleet-auth differ", peer)
            else:
                log.warning("a node at %s went away while joining: %s", peer, getattr(e, "message", None) or e)
            writer.close()
            return
        name = ack.node or f"{peer[0]}:{peer[1]}"
        n = next((x for x in self.nodes if x.port == 0 and x.host == name), None)
        if n is None:
            n = NodeConn(name, 0)
            self.nodes.append(n)
        elif n.link is not None:
            n.link.close()  # the node joined again: this link replaces the old one
        await self._session(n, link, ack)

    def _refused(self, n: NodeConn, why: str) -> None:
        if n.refused is None:
            log.error("node %s refused the fleet token: %s", n.addr, why)
        n.refused = why

    async def _session(self, n: NodeConn, link: Link, ack: m.HelloAck) -> None:
        """One live link to a node: reconcile, then read until it ends (net/transport.py sends
        the KEEPALIVEs, which also renew the node's leases, and drops a silent node)."""
        n.link, n.up, n.refused = link, True, None
        n.name, n.models, n.status = ack.node, list(ack.models), ack.status.report()
        log.info("fleet node %s (%s) is up, serving %s", n.addr, n.name,
                 ", ".join(x.id for x in n.models) or "nothing")
        view: dict[str, tuple[int, int]] = {}
        for eng in self.engines:
            view.update(eng.node_up(n))
        if view:
            self.send(n, m.Reconcile(view))
        try:
            await link.serve(lambda kind, body: self._on_message(n, kind, body))
        except (ConnectionError, OSError, SuperfluidError) as e:
            log.warning("lost the link to node %s: %s", n.addr, getattr(e, "message", None) or e or "closed")
        finally:
            link.close()
            if n.link is link:
                n.up, n.link = False, None
                now = time.monotonic()
                for eng in self.engines:
                    eng.node_lost(n, at=now)

    def _owner(self, gen: str):
        return next((e for e in self.engines if e.owns(gen)), None)

    def _on_message(self, n: NodeConn, kind: int, body: Any) -> None:
        if kind == m.TOKEN_EVENTS:
            eng = self._owner(body.gen)
            if eng is None:  # a generation that ended here (or a stale one): the node drops it
                self.cancel(n, body.gen)
            else:
                eng.on_tokens(n, body)
        elif kind == m.EMBED_RESP:
            eng = self._owner(body.id)
            if eng is not None:
                eng.on_embedded(n, body)
        elif kind == m.NODE_STATUS:
            n.status = body.report()
        elif kind == m.NODE_PREFIXES:
            n.set_prefixes(body)
        elif kind == m.RECONCILE_ACK:
            for gen in body.missing:  # the node lost them (it restarted): move them now
                eng = self._owner(gen)
                if eng is not None:
                    eng.node_lost(n, at=0.0, gens=(gen,))
