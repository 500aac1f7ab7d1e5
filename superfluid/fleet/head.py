"""The fleet head's engine: the same interface as a local Engine (check, submit, cancel,
keep_running, status), but its generations run on nodes over Link F. The head keeps the
tokenizer and template (the API layer builds prompts here) and the session log; nodes
run scheduler + worker and stream back numbered chunks.

Exactly once: each placed generation has a Tracker (link/head_state.py) that accepts only
the next seq of its current epoch; the head acknowledges a watermark. A dropped link is
redialled and reconciled (the node resends exactly the missing tail). A node that does not
come back within `grace` seconds loses its generations: each is re-placed on another node
under a new epoch, with the tokens already delivered as context and the remaining budget,
so the client's stream goes on with no token twice and none missing."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..engine import Engine
from ..errors import ContextLengthExceeded, SuperfluidError, WorkerUnavailable
from ..link import messages as m
from ..link.head_state import Counter, Tracker
from ..link.noise import AuthFailed
from ..request import Chunk, FinishReason, GenRequest
from .node import spec_to_wire
from .placement import pick
from .transport import Link

log = logging.getLogger("superfluid.fleet")

KEEPALIVE_EVERY = 1.0


@dataclass(eq=False)
class NodeConn:
    """The head's view of one node it dials."""
    host: str
    port: int
    up: bool = False
    link: Link | None = None
    name: str = ""
    models: list = field(default_factory=list)
    status: dict = field(default_factory=dict)
    last_heard: float = 0.0
    refused: str | None = None  # why the node refused us (a wrong token), logged once

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}" if self.port else f"{self.host} (joined)"

    def window(self, model_id: str) -> int:
        return max((int(x.get("n_ctx", 0)) for x in self.models if x.get("id") == model_id), default=0)


@dataclass(eq=False)
class _Placed:
    req: GenRequest
    tracker: Tracker
    node: NodeConn | None = None
    delivered: list[int] = field(default_factory=list)  # tokens the client already has
    base: int = 0  # tokens delivered before the current placement
    lost_at: float | None = None


class FleetEngine(Engine):
    def __init__(self, cfg, tokenizer, n_ctx: int, nodes: list[tuple[str, int]], psk: bytes | None, *,
                 policy: str = "load-aware", epoch_floor: int = 0, timeout: float = 5.0, grace: float = 1.0,
                 listen: tuple[str, int] | None = None):
        super().__init__(cfg, tokenizer, n_ctx)
        self.listen_at = listen
        self._server: asyncio.Server | None = None
        self.nodes = [NodeConn(h, p) for h, p in nodes]
        self.psk = psk
        self.policy = policy
        self.timeout = timeout  # a node silent this long is gone
        self.grace = grace  # a gone node has this long to come back before its work moves
        self.epochs = Counter(epoch_floor)
        self.cmds = Counter(epoch_floor)
        self._placed: dict[str, _Placed] = {}
        self._rr = itertools.count()
        self._bg: list[asyncio.Task] = []

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return any(n.up for n in self.nodes)

    async def start(self) -> None:
        if self.listen_at is not None:
            self._server = await self.listen(*self.listen_at)
            if not self.nodes:
                self._fit_window()
                self._bg.append(asyncio.create_task(self._watch(), name="fleet-watch"))
                return  # nodes join when they will; requests wait for none (503 until one has)
        self._bg = [asyncio.create_task(self._run_node(n), name=f"fleet-{n.addr}") for n in self.nodes]
        self._bg.append(asyncio.create_task(self._watch(), name="fleet-watch"))
        deadline = time.monotonic() + 120
        while not self.ready and time.monotonic() < deadline:
            refused = [n for n in self.nodes if n.refused]
            if refused and len(refused) == len(self.nodes):
                break
            await asyncio.sleep(0.1)
        if not self.ready:
            why = "; ".join(f"{n.addr}: {n.refused or 'no answer'}" for n in self.nodes)
            await self.close()
            raise WorkerUnavailable(f"no fleet node is reachable ({why})")
        self._fit_window()

    async def close(self, error: SuperfluidError | None = None) -> None:
        for t in self._bg:
            t.cancel()
        if self._server is not None:
            self._server.close()
        finish = FinishReason.ERROR if error else FinishReason.CANCELLED
        for p in list(self._placed.values()):
            st = self._streams.get(p.req.id)
            if st is not None:
                self._end(st, st.final(finish, error))
        self._placed.clear()
        for n in self.nodes:
            if n.link is not None:
                n.link.close()

    def _fit_window(self) -> None:
        """Requests are checked against the largest window a connected node offers."""
        windows = [n.window(self.model_id) for n in self.nodes if n.up]
        if windows and max(windows) > 0:
            self.sched.n_ctx = max(windows)

    # -- the API's view ------------------------------------------------------------------
    def submit(self, req: GenRequest) -> AsyncIterator[Chunk]:
        self.check(req)
        self.last_used = time.monotonic()
        p = _Placed(req, Tracker(req.id, 0))
        self._place(p)  # raises when no node can take it
        st = self._stream_for(req)
        self._placed[req.id] = p
        return self._iterate(st)

    def _stream_for(self, req: GenRequest):
        from ..codec.detok import TextStream
        from ..delivery import Stream
        st = Stream(req, TextStream(self.tokenizer.pieces, self.tokenizer.eog, ()))
        self._streams[req.id] = st
        return st

    def cancel(self, request_id: str) -> bool:
        p = self._placed.pop(request_id, None)
        st = self._streams.pop(request_id, None)
        if st is None:
            return False
        st.done = True
        if p is not None and p.node is not None and p.node.up and p.node.link is not None:
            self._send(p.node, m.GENERATE_CANCEL, {"cmd": self.cmds.next(), "gen": p.req.id})
        if st.req.session is not None and self.log is not None:
            self.log.end(st.req, FinishReason.CANCELLED)
        self.out.push(st, st.final(FinishReason.CANCELLED))
        return True

    def _fail(self, st, err: Exception) -> None:
        p = self._placed.pop(st.req.id, None)
        if p is not None and p.node is not None and p.node.up:
            self._send(p.node, m.GENERATE_CANCEL, {"cmd": self.cmds.next(), "gen": p.req.id})
        self._streams.pop(st.req.id, None)
        st.done = True
        st.queue.put_nowait(st.final(FinishReason.ERROR, err))

    @property
    def idle(self) -> bool:
        return not self._streams

    def kv_usage(self) -> tuple[int, int]:
        ups = [n.status for n in self.nodes if n.up]
        return sum(int(s.get("kv_used", 0)) for s in ups), sum(int(s.get("kv_total", 0)) for s in ups)

    def status(self) -> dict:
        return {"running": len(self._placed), "waiting": 0, "lanes": sum(int(n.status.get("lanes", 0))
                                                                       for n in self.nodes if n.up),
                "ready": self.ready, "worker_pid": None, "steps": 0, "kv_slots": 0,
                "nodes": [{"addr": n.addr, "name": n.name, "up": n.up, "status": n.status,
                           "placed": sum(1 for p in self._placed.values() if p.node is n)} for n in self.nodes]}

    # -- placement -------------------------------------------------------------------------
    def _place(self, p: _Placed) -> None:
        need = len(p.req.prompt) + p.req.max_tokens
        load = {id(n): sum(1 for q in self._placed.values() if q.node is n) for n in self.nodes}
        node = pick([n for n in self.nodes if n.up], self.model_id, need, self.policy, load, next(self._rr))
        if node is None:
            fits = [n.window(self.model_id) for n in self.nodes if n.up]
            if fits and max(fits) < need:
                raise ContextLengthExceeded(f"no fleet node has a context window for {need} tokens; the "
                                            f"largest is {max(fits)}", param="messages")
            raise WorkerUnavailable("no fleet node is up to take the request; retry")
        epoch = self.epochs.next()
        if p.tracker.epoch == 0:
            p.tracker = Tracker(p.req.id, epoch)
        else:
            p.tracker.replace(epoch)
        p.node, p.lost_at, p.base = node, None, len(p.delivered)
        r = p.req
        self._send(node, m.GENERATE_REQ, {
            "cmd": self.cmds.next(), "gen": r.id, "session": r.session or r.id, "epoch": epoch,
            "prompt": list(r.prompt) + p.delivered, "sampling": r.sampling.to_wire(),
            "max_tokens": r.max_tokens - len(p.delivered), "stop": list(r.stop), "qos": int(r.qos),
            "channels": spec_to_wire(r.channels), "history": list(r.history) + p.delivered})

    def _send(self, node: NodeConn, kind: int, body: dict) -> None:
        if node.link is None:
            return
        try:
            node.link.send(kind, body)
        except ConnectionError:
            pass

    async def _watch(self) -> None:
        """Liveness and failover: a silent node is dropped; work on a node gone for
        longer than `grace` moves."""
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for n in self.nodes:
                if n.up and n.link is not None and now - n.last_heard > self.timeout:
                    log.warning("node %s silent for %.1f s: treating it as gone", n.addr, now - n.last_heard)
                    n.link.close()
            for p in list(self._placed.values()):
                if p.lost_at is not None and now - p.lost_at > self.grace:
                    self._failover(p)

    def _failover(self, p: _Placed) -> None:
        old = p.node
        try:
            self._place(p)
        except SuperfluidError as e:
            if time.monotonic() - (p.lost_at or 0) > self.grace + 30:
                st = self._streams.get(p.req.id)
                self._placed.pop(p.req.id, None)
                if st is not None:
                    self._end(st, st.final(FinishReason.ERROR, e))
            return
        log.warning("re-placed %s from %s on %s (epoch %d, %d tokens delivered)", p.req.id,
                    old.addr if old else "?", p.node.addr if p.node else "?", p.tracker.epoch, len(p.delivered))
        if old is not None and old.up:
            self._send(old, m.SESSION_REVOKE, {"session": p.req.session or p.req.id, "epoch": p.tracker.epoch})

    # -- the links -------------------------------------------------------------------------
    async def _run_node(self, n: NodeConn) -> None:
        backoff = 0.1
        while True:
            try:
                link = await Link.dial(n.host, n.port, self.psk)
                link.send(m.HELLO, {"versions": [m.VERSION]})
                kind, ack = await asyncio.wait_for(link.recv(), 10.0)
                if kind != m.HELLO_ACK:
                    raise ConnectionError(f"expected HELLO_ACK, got message {kind}")
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
                    for p in self._placed.values():
                        if p.node is n:
                            p.lost_at = 0.0
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            await self._session(n, link, ack)

    async def _session(self, n: NodeConn, link: Link, ack: dict) -> None:
        """One live link to a node (dialed or joined): reconcile, then read until it ends."""
        n.link, n.up, n.refused = link, True, None
        n.name, n.models = str(ack.get("node", "")), list(ack.get("models") or [])
        n.status = ack.get("status") or {}
        n.last_heard = time.monotonic()
        log.info("fleet node %s (%s) is up", n.addr, n.name)
        self._fit_window()
        self._reconcile(n)
        ticker = asyncio.create_task(self._keepalive(n, link))
        try:
            while True:
                kind, body = await link.recv()
                n.last_heard = time.monotonic()
                try:
                    self._on_message(n, kind, body)
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise m.malformed(kind, e) from None
        except (ConnectionError, OSError, SuperfluidError) as e:
            log.warning("lost the link to node %s: %s", n.addr, getattr(e, "message", None) or e or "closed")
        finally:
            ticker.cancel()
            link.close()
            if n.link is link:
                n.up, n.link = False, None
                now = time.monotonic()
                for p in self._placed.values():
                    if p.node is n and p.lost_at is None:
                        p.lost_at = now

    async def listen(self, host: str, port: int) -> asyncio.Server:
        """Accept nodes that join (`superfluid node join`): the head still initiates the
        secure channel; a node that joins again under the same name gets its generations
        back (RECONCILE)."""
        return await asyncio.start_server(self._on_join, host, port)

    async def _on_join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            link = await Link.accept(reader, writer, self.psk, initiator=True)
            link.send(m.HELLO, {"versions": [m.VERSION]})
            kind, ack = await asyncio.wait_for(link.recv(), 10.0)
            if kind != m.HELLO_ACK:
                raise ConnectionError(f"expected HELLO_ACK, got message {kind}")
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
        name = str(ack.get("node", "")) or f"{peer[0]}:{peer[1]}"
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

    async def _keepalive(self, n: NodeConn, link: Link) -> None:
        while not link.closed:
            self._send(n, m.KEEPALIVE, {})  # also renews the lease of every session on the node, idle or not
            await asyncio.sleep(KEEPALIVE_EVERY)

    def _reconcile(self, n: NodeConn) -> None:
        view = {p.req.id: [p.tracker.epoch, p.tracker.watermark] for p in self._placed.values() if p.node is n}
        for p in self._placed.values():
            if p.node is n:
                p.lost_at = None
        if view:
            self._send(n, m.RECONCILE, {"gens": view})

    def _on_message(self, n: NodeConn, kind: int, body: dict) -> None:
        if kind == m.TOKEN_EVENTS:
            self._on_tokens(n, body)
        elif kind == m.NODE_STATUS:
            n.status = body
        elif kind == m.RECONCILE_ACK:
            for gen in body.get("missing") or []:  # the node lost them (it restarted): move them now
                p = self._placed.get(str(gen))
                if p is not None and p.node is n:
                    p.lost_at = 0.0

    def _on_tokens(self, n: NodeConn, body: dict) -> None:
        gen, epoch = str(body.get("gen")), int(body.get("epoch", -1))
        p = self._placed.get(gen)
        if p is None or p.node is not n or p.tracker.epoch != epoch:
            # a stale epoch or a generation that ended here: never delivered; the node drops it
            if p is None or p.node is not n:
                self._send(n, m.GENERATE_CANCEL, {"cmd": self.cmds.next(), "gen": gen})
            return
        st = self._streams.get(gen)
        outs = []
        for seq, w in body.get("events") or []:
            if not p.tracker.accept(epoch, int(seq)):
                continue
            c = m.chunk_from_wire(gen, w)
            p.delivered += c.tokens
            if st is not None:
                st.n_out = len(p.delivered)  # the stream's count, for a final chunk off the token path
            c.prompt_tokens = len(p.req.prompt)
            c.completion_tokens += p.base
            if st is not None:
                outs.append((st, c))
            if c.finish is not None:
                self._placed.pop(gen, None)
                if st is not None:
                    st.done = True
                    self._streams.pop(gen, None)
                break
        self._send(n, m.WATERMARK_ACK, {"gen": gen, "epoch": epoch, "upto": p.tracker.watermark})
        self.out.publish(outs)
