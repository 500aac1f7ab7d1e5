"""A fleet node: one local Engine (scheduler + worker, nothing durable) behind Link F.

The head dials in and sends GENERATE_REQ; each generation's chunks become numbered token
events in a retry buffer (link/node_state.py) sent as they come and kept until the head
acknowledges them, so a head that reconnects gets exactly the missing tail. The link's
lease: a head silent for `lease_s` (it sends KEEPALIVE every second, idle or not) loses its
generations on this node; they are cancelled (fenced), and the head re-places them."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

from ..codec.channels import spec_from_wire, spec_to_wire  # noqa: F401 -- the head sends what a node reads
from ..engine.embedding import EmbedInput
from ..errors import ProtocolError, SuperfluidError
from ..link import messages as m
from ..link.node_state import NodeState, RetryBuffer, expired
from ..request import Chunk, FinishReason, GenRequest, Qos, SamplingParams
from ..net.transport import Doorman, Link
from .prefixes import NodeSummary
from .stats import node_status

log = logging.getLogger("superfluid.node")

SPEC_MAX = 32  # most drafts per step a head may ask of this node (a verified row costs about a token)
STATUS_EVERY = 2.0
STATUS_POLL = 0.25  # how soon a change in its status is reported


class _Head:
    """One head's connection; a generation belongs to the head that asked for it (or that
    later reconciled it) and its lease runs on that head's last word."""

    def __init__(self, link: Link, instance: str = ""):
        self.link = link
        self.instance = instance  # the head process's id from HELLO: its command ids' namespace

    @property
    def last_heard(self) -> float:
        return self.link.live.last_heard


class NodeServer:
    REDIAL_MAX = 5.0  # a joining node dials its head again at most this many seconds apart

    def __init__(self, engine, psk: bytes | None, *, node_id: str | None = None, lease_s: float = 10.0):
        self.engine = engine
        self.psk = psk
        self.node_id = node_id or socket.gethostname()
        self.lease_s = lease_s
        self.state = NodeState()
        self.heads: set[_Head] = set()
        self._owner: dict[str, _Head] = {}  # gen -> the head its events go to
        self._pumps: dict[str, asyncio.Task] = {}  # gen -> task feeding its retry buffer
        self._requests: dict[str, str] = {}  # gen -> engine request id
        self._door = Doorman()  # connections mid-handshake (heads dialling in)
        self._tasks: list[asyncio.Task] = []
        self._prefixes = NodeSummary()

    async def serve(self, host: str, port: int) -> asyncio.Server:
        server = await asyncio.start_server(self._on_connect, host, port)
        self._tasks.append(asyncio.create_task(self._watchdog()))
        return server

    def close(self) -> None:
        """Stop the watchdog, drop every head's link and cancel what runs for them."""
        for t in self._tasks:
            t.cancel()
        for h in list(self.heads):
            h.link.close()
        for gen in list(self._owner):
            self._cancel(gen)

    # -- connections ---------------------------------------------------------------------
    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._door.entry(writer):  # idle sockets cannot lock the real head out
            try:
                got = await asyncio.wait_for(self._handshake(reader, writer), self._door.deadline)
            except TimeoutError:
                writer.close()
                got = None
        if got is not None:
            await self._session(*got)

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> tuple[Link, str] | None:
        """The responder's side of the secure channel (the head always initiates), then HELLO."""
        peer = writer.get_extra_info("peername")
        try:
            link = await Link.accept(reader, writer, m.LINK_F, self.psk)
            hello = await link.welcome(5.0)
            return link, hello.head
        except SuperfluidError as e:
            log.warning("refused a head at %s: %s", peer, e.message)
        except (TimeoutError, ConnectionError, OSError) as e:
            log.warning("a head at %s went away during the handshake: %s", peer, e or type(e).__name__)
        writer.close()
        return None

    async def join(self, host: str | None, port: int, *, find=None) -> None:
        """Dial a head (`superfluid node join`) and serve it; dial again with backoff when
        the link drops, forever. With `find` (mDNS), the head is looked up first, and again
        after three failed dials in a row (the head moved or restarted elsewhere)."""
        self._tasks.append(asyncio.create_task(self._watchdog()))
        backoff, failures, turn = 0.2, 0, 0
        while True:
            if find is not None and (host is None or failures >= 3):
                try:
                    heads = await find()
                except Exception as e:  # no multicast route yet, an interface that went away
                    log.warning("mDNS lookup failed (%s: %s); looking again", type(e).__name__, e)
                    heads = []
                if not heads:
                    log.info("no head of this fleet answers on mDNS; looking again")
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.REDIAL_MAX)
                    continue
                # a head may advertise several addresses (one per interface): try them in turn
                pick = heads[turn % len(heads)] if (host, port) in heads else heads[0]
                turn += 1
                if pick != (host, port):
                    log.info("found a head at %s:%d by mDNS", *pick)
                host, port = pick
                failures = 0
            assert host is not None
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except (OSError, OverflowError) as e:
                log.info("head %s:%d not reachable (%s); retrying", host, port, getattr(e, "strerror", None) or e)
                failures += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.REDIAL_MAX)
                continue
            got = await self._handshake(reader, writer)
            if got is not None:
                backoff, failures = 0.2, 0
                await self._session(*got)
            else:
                failures += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.REDIAL_MAX)

    async def _session(self, link: Link, instance: str = "") -> None:
        head = _Head(link, instance)
        self.heads.add(head)
        link.send(self.hello_ack())
        self._send_prefixes(link)
        log.info("head %s connected", link.peer)
        ticker = asyncio.create_task(self._tick(link))
        try:
            await link.serve(lambda kind, body: self._on_message(head, kind, body))
        except SuperfluidError as e:
            log.warning("dropping the link to %s: %s", link.peer, e.message)
        except (ConnectionError, OSError):
            log.info("head %s disconnected", link.peer)
        finally:
            ticker.cancel()
            link.close()
            self.heads.discard(head)
            self.head_gone(head)

    async def _tick(self, link: Link) -> None:
        """NODE_STATUS (and NODE_PREFIXES) every STATUS_EVERY seconds, and NODE_STATUS within
        STATUS_POLL of any change (lanes, queue, KV, counters), so a head's /metrics follows
        its nodes as they fill, generate and drain; an idle node's status does not change,
        and it sends only the periodic one (the link sends the KEEPALIVEs)."""
        sent = time.monotonic()
        last = None
        while not link.closed:
            await asyncio.sleep(STATUS_POLL)
            now = time.monotonic()
            try:
                status = self.status()
                due = now - sent >= STATUS_EVERY
                if due or status != last:
                    link.send(m.NodeStatus(**status))
                    sent, last = (now if due else sent), status
                if due:
                    self._send_prefixes(link)
            except ConnectionError:
                return

    def _send_prefixes(self, link: Link) -> None:
        """What this node's KV holds, for cache-aware placement (a separate optional message:
        a head that predates it drops it)."""
        body = self._prefixes.fields(self.engine)
        if body:
            link.send(m.NodePrefixes(**body))

    async def _watchdog(self) -> None:
        """The lease: generations whose head has been silent for lease_s are fenced."""
        while True:
            await asyncio.sleep(1.0)
            stale = expired({g: h.last_heard for g, h in self._owner.items()}, time.monotonic(), self.lease_s)
            if stale:
                log.warning("no word from their head for %.0f s: fencing %d generation(s)", self.lease_s, len(stale))
            for gen in stale:
                self._cancel(gen)

    def hello_ack(self) -> m.HelloAck:
        eng = self.engine
        return m.HelloAck(m.VERSION, self.node_id,
                          (m.ModelOffer(eng.model_id, int(eng.n_ctx), int(eng.cfg.max_batch),
                                        int(eng.embed_window or 0), str(eng.model_kind)),),
                          m.NodeStatus(**self.status()))

    def head_gone(self, head: _Head) -> None:
        """A head's link ended (its generations wait for its lease; stages drop its work)."""

    def status(self) -> dict:
        """NODE_STATUS: the engine's stats() as fleet/stats.py puts them on the wire."""
        return node_status(self.engine.stats())

    # -- messages ------------------------------------------------------------------------
    def _on_message(self, head: _Head, kind: int, body: Any) -> None:
        link = head.link
        if kind == m.GENERATE_REQ:
            self._generate(head, body)
        elif kind == m.GENERATE_CANCEL:
            if self.state.first_time(body.cmd, head.instance):
                self._cancel(body.gen)
        elif kind == m.WATERMARK_ACK:
            self.state.ack(body.gen, body.epoch, body.upto)
            if body.gen not in self.state.gens:  # finished and acknowledged: forget it
                self._owner.pop(body.gen, None)
        elif kind == m.RECONCILE:
            resend, missing = self.state.reconcile(body.gens)
            for buf, tail in resend:
                self._owner[buf.gen] = head  # the reconnected head takes its generations back
                if tail:
                    self._send(buf, tail)
            link.send(m.ReconcileAck(tuple(missing)))
        elif kind == m.SESSION_REVOKE:
            for gen in self.state.revoke(body.session, body.epoch):
                self._cancel(gen)
        elif kind == m.EMBED_REQ:
            inputs = [EmbedInput(list(toks), at) for toks, at in body.inputs]
            task = asyncio.create_task(self._embed(head, body.id, inputs, Qos(body.qos)))
            self._tasks.append(task)
            task.add_done_callback(self._tasks.remove)

    async def _embed(self, head: _Head, rid: str, inputs: list[EmbedInput], qos: Qos) -> None:
        """A batch to embed: answered to the head that asked, if it is still there (it sends
        the batch elsewhere when it loses us: embedding is idempotent)."""
        try:
            vectors = await self.engine.embed(inputs, qos)
            resp = m.EmbedResp(rid, vectors=tuple(v.astype("<f4").tobytes() for v in vectors))
        except SuperfluidError as e:
            resp = m.EmbedResp(rid, error=(e.code or e.type, e.message))
        if not head.link.closed:
            try:
                try:
                    head.link.send(resp)
                except ProtocolError as e:  # over the frame cap: the head gets an error, not silence
                    head.link.send(m.EmbedResp(rid, error=(e.code or "protocol_error", e.message)))
            except ConnectionError:
                pass

    def _generate(self, head: _Head, b: m.GenerateReq) -> None:
        gen, epoch, session = b.gen, b.epoch, b.session
        if not self.state.first_time(b.cmd, head.instance):
            return
        if not self.state.admit(session, epoch):
            log.info("fenced a stale GENERATE_REQ for %s (epoch %d)", gen, epoch)
            return
        buf = self.state.open(gen, epoch, session)
        self._owner[gen] = head
        req = GenRequest(f"{gen}@{epoch}", list(b.prompt), SamplingParams.from_wire(list(b.sampling)),
                         b.max_tokens, b.stop, Qos(b.qos), channels=spec_from_wire(b.channels), history=b.history,
                         speculate=None if b.speculate is None else max(0, min(b.speculate, SPEC_MAX)),
                         persist=b.persist, cache_ns=b.cache_ns[:64])
        try:
            self.engine.check(req)
            stream = self.engine.submit(req)
        except SuperfluidError as e:
            self._send(buf, [buf.emit(m.chunk_to_wire(Chunk(req.id, finish=FinishReason.ERROR, error=e)), last=True)])
            return
        self._requests[gen] = req.id
        self._pumps[gen] = asyncio.create_task(self._pump(gen, buf, stream))

    async def _pump(self, gen: str, buf: RetryBuffer, stream) -> None:
        try:
            async for c in stream:
                self._send(buf, [buf.emit(m.chunk_to_wire(c), last=c.finish is not None)])
                if c.finish is not None:
                    break
        finally:
            self._pumps.pop(gen, None)
            self._requests.pop(gen, None)

    def _send(self, buf: RetryBuffer, events: list) -> None:
        head = self._owner.get(buf.gen)
        if head is None or head.link.closed:
            return  # kept in the retry buffer: the head gets them after RECONCILE
        try:
            head.link.send(m.TokenEvents(buf.gen, buf.epoch, tuple(events)))
        except ConnectionError:
            pass

    def _cancel(self, gen: str) -> None:
        """Stop a generation and forget it (fenced: nothing more of it is ever sent)."""
        self.state.gens.pop(gen, None)
        self._owner.pop(gen, None)
        rid = self._requests.pop(gen, None)
        if rid is not None:
            self.engine.cancel(rid)
        task = self._pumps.pop(gen, None)
        if task is not None:
            task.cancel()
