"""The socket code of both links, the only place that reads one: a Link is a connection
(link/conn.py, sans-I/O) over an asyncio stream. Link F dials or accepts TCP with the
secure channel on top; Link W wraps one end of a socketpair.

`recv()` is the one read; `serve()` is the one receive loop (messages to a handler,
KEEPALIVEs sent and consumed, a peer silent past the protocol's `silence` dropped).
`greet()` / `welcome()` are the two halves of HELLO. Errors a peer can cause are
ProtocolError / AuthFailed, or ConnectionError when the connection ends."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import ProtocolError
from .link.conn import KEEPALIVE, Connection, Liveness, Protocol
from .link.noise import SecureChannel

HANDSHAKE_TIMEOUT = 5.0
READ = 1 << 20

Handler = Callable[[int, Any], Awaitable[None] | None]


class Link:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Connection):
        self.reader, self.writer, self.conn = reader, writer, conn
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "peer")
        self.live = Liveness(conn.proto.keepalive, conn.proto.silence, time.monotonic(), time.monotonic())
        self.closed = False

    # -- opening -------------------------------------------------------------------------
    @classmethod
    async def dial(cls, host: str, port: int, proto: Protocol, psk: bytes | None,
                   timeout: float = HANDSHAKE_TIMEOUT) -> Link:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        return await cls._secure(reader, writer, proto, psk, timeout, initiator=True)

    @classmethod
    async def accept(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proto: Protocol,
                     psk: bytes | None, timeout: float = HANDSHAKE_TIMEOUT, *, initiator: bool = False) -> Link:
        """A link over a connection someone else opened. The head initiates the secure
        channel whichever side dialed (a node that joins a head is the responder)."""
        return await cls._secure(reader, writer, proto, psk, timeout, initiator=initiator)

    @classmethod
    async def over(cls, sock: socket.socket, proto: Protocol) -> Link:
        """Link W: one end of a socketpair (no secure channel: same host, same user)."""
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=READ)
        return cls(reader, writer, Connection(proto))

    @classmethod
    async def _secure(cls, reader, writer, proto: Protocol, psk: bytes | None, timeout: float, *,
                      initiator: bool) -> Link:
        link = cls(reader, writer, Connection(proto, SecureChannel(initiator=initiator, psk=psk)))
        try:
            writer.write(link.conn.start())
            await asyncio.wait_for(link._handshake(), timeout)
        except BaseException:
            link.close()
            raise
        return link

    async def _handshake(self) -> None:
        while not self.conn.ready:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("the peer closed the connection during the handshake")
            self._feed(data)
        await self.writer.drain()

    # -- HELLO -----------------------------------------------------------------------------
    async def greet(self, hello: Any, timeout: float = 10.0) -> Any:
        """The initiator's half: send HELLO, return the peer's HELLO_ACK (version checked)."""
        self.send(hello)
        return self.conn.check_ack(*await asyncio.wait_for(self.recv(), timeout))

    async def welcome(self, timeout: float | None = 5.0) -> Any:
        """The responder's half: the peer's HELLO, checked to name our version. The caller
        answers HELLO_ACK (a worker loads its model first)."""
        return self.conn.check_hello(*await asyncio.wait_for(self.recv(), timeout))

    # -- messages --------------------------------------------------------------------------
    def send(self, msg: Any, *, correlation: int = 0) -> None:
        """One typed message (ProtocolError if it is over the frame cap)."""
        self._write(self.conn.send(msg, correlation=correlation))

    def send_raw(self, msg_type: int, body: Any) -> None:
        self._write(self.conn.send_raw(msg_type, body))

    def _write(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("the link is closed")
        self.writer.write(data)
        self.live.sent(time.monotonic())

    def _feed(self, data: bytes) -> None:
        reply = self.conn.receive_data(data)
        if reply:
            self.writer.write(reply)

    async def recv(self) -> tuple[int, Any]:
        """The next message (type, typed message or raw body), KEEPALIVEs included; optional
        types this end does not know are dropped."""
        while True:
            ev = self.conn.next_event()
            if ev is not None:
                self.live.heard(time.monotonic())
                return ev
            if self.closed:
                raise ConnectionError("the link is closed")
            data = await self.reader.read(READ)
            if not data:
                raise ConnectionError("the peer closed the connection")
            self._feed(data)

    async def serve(self, handler: Handler) -> None:
        """Read until the link ends, handing each message but KEEPALIVE to `handler` (sync or
        async). A handler's KeyError / TypeError / ValueError is the peer's malformed message:
        a ProtocolError that ends the link. Ends with the error that ended the link; returns
        when the handler closed it."""
        ticker = asyncio.create_task(self._tick()) if self.live.every or self.live.silence else None
        try:
            while not self.closed:
                kind, body = await self.recv()
                if kind == KEEPALIVE:
                    continue
                try:
                    got = handler(kind, body)
                    if inspect.isawaitable(got):
                        await got
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise ProtocolError(f"message {kind} has a malformed body ({type(e).__name__}: {e})") from None
                if not self.closed:
                    await self.writer.drain()
        finally:
            if ticker is not None:
                ticker.cancel()
            if ticker is not None and self.live.silent(time.monotonic()):
                self.close()
                raise ConnectionError(f"the peer was silent for {self.live.silence:.1f} s")

    async def _tick(self) -> None:
        """KEEPALIVEs while the link is up; a silent peer's link is closed (serve then ends)."""
        step = min(x for x in (self.live.every, self.live.silence, 0.25) if x)
        while not self.closed:
            now = time.monotonic()
            if self.live.silent(now):
                self.close()
                return
            if self.live.keepalive_due(now):
                with contextlib.suppress(ConnectionError):
                    self._write(self.conn.keepalive())
            await asyncio.sleep(step)

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.writer.close()


class Doorman:
    """Who may be mid-handshake on a listening socket: at most `per_addr` connections from one
    address and `total` in all, each for at most `deadline` seconds. A new connection past a
    limit closes the oldest one waiting (from its address, else of all): idle sockets cannot
    hold the door shut, since a real peer finishes its handshake in milliseconds."""

    def __init__(self, total: int = 64, per_addr: int = 16, deadline: float = HANDSHAKE_TIMEOUT):
        self.total, self.per_addr, self.deadline = total, per_addr, deadline
        self._waiting: dict[asyncio.StreamWriter, str] = {}  # in arrival order

    @contextlib.contextmanager
    def entry(self, writer: asyncio.StreamWriter):
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        mine = [w for w, h in self._waiting.items() if h == host]
        if len(mine) >= self.per_addr:
            self._evict(mine[0])
        if len(self._waiting) >= self.total:
            self._evict(next(iter(self._waiting)))
        self._waiting[writer] = host
        try:
            yield
        finally:
            self._waiting.pop(writer, None)

    def _evict(self, writer: asyncio.StreamWriter) -> None:
        self._waiting.pop(writer, None)
        writer.close()  # its handshake ends with a ConnectionError
