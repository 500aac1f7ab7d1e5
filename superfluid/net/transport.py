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

from ..errors import ProtocolError
from ..link import messages as lm
from ..link.conn import KEEPALIVE, Connection, Liveness, Protocol
from ..link.noise import SecureChannel

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


WINDOW = 4 << 20  # bytes of a tunnelled stream in flight (sent, not yet acknowledged)
CHUNK = 256 << 10  # one RPC_DATA's bytes at most
ACK_AT = WINDOW // 4  # bytes taken before they are acknowledged: an RPC's small messages need no RPC_ACK each


class _Stream:
    def __init__(self, sid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.sid, self.reader, self.writer = sid, reader, writer
        self.credit = WINDOW  # what we may still send before the peer acknowledges
        self.more = asyncio.Event()
        self.unacked = 0  # received and written on, not yet acknowledged to the peer
        self.acking: asyncio.Task | None = None
        self.pump: asyncio.Task | None = None


class Tunnels:
    """Byte streams (TCP connections on this host) carried over one Link F as RPC_OPEN /
    RPC_DATA / RPC_ACK / RPC_CLOSE (link/messages.py), so a local socket's bytes travel inside
    the link's secure channel. Flow control per stream: a sender has at most WINDOW bytes
    that the other end has not yet written on; more is the peer's ProtocolError, so one
    stream can neither exhaust memory nor stall the link's other messages.

    `attach` starts carrying a local connection; `on_message` takes the link's RPC_DATA /
    RPC_ACK / RPC_CLOSE (True when it was one); `close` ends every stream."""

    def __init__(self, link: Link, *, max_streams: int = 16):
        self.link, self.max_streams = link, max_streams
        self.streams: dict[int, _Stream] = {}
        self.bytes_in = self.bytes_out = 0  # payload carried, each way

    def attach(self, sid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if sid in self.streams or len(self.streams) >= self.max_streams:
            raise ProtocolError(f"stream {sid} is open already or past {self.max_streams} streams")
        st = self.streams[sid] = _Stream(sid, reader, writer)
        st.pump = asyncio.create_task(self._pump(st))

    async def _pump(self, st: _Stream) -> None:
        """The local connection's bytes to the peer, within the window."""
        error = ""
        try:
            while True:
                while st.credit <= 0:
                    st.more.clear()
                    await st.more.wait()
                data = await st.reader.read(min(CHUNK, st.credit))
                if not data:
                    break
                st.credit -= len(data)
                self.bytes_out += len(data)
                self.link.send(lm.RpcData(st.sid, data))
                await self.link.drain()
        except (ConnectionError, OSError) as e:
            error = f"{type(e).__name__}: {e}"
        if self.streams.pop(st.sid, None) is not None:
            st.writer.close()
            with contextlib.suppress(ConnectionError):
                self.link.send(lm.RpcClose(st.sid, error))

    async def _ack(self, st: _Stream) -> None:
        try:
            while st.unacked >= ACK_AT:
                await st.writer.drain()
                n, st.unacked = st.unacked, 0
                self.link.send(lm.RpcAck(st.sid, n))
        except (ConnectionError, OSError):
            self._end(st.sid, "")
        finally:
            st.acking = None

    def on_message(self, kind: int, body: Any) -> bool:
        if kind == lm.RPC_DATA:
            st = self.streams.get(body.stream)
            if st is None:
                return True  # a stream that just ended here: its last bytes have nowhere to go
            st.unacked += len(body.data)
            if st.unacked > WINDOW:
                raise ProtocolError(f"stream {body.stream} sent past its window of {WINDOW} bytes")
            self.bytes_in += len(body.data)
            st.writer.write(body.data)
            if st.acking is None and st.unacked >= ACK_AT:
                st.acking = asyncio.create_task(self._ack(st))
        elif kind == lm.RPC_ACK:
            st = self.streams.get(body.stream)
            if st is not None:
                if body.n <= 0 or st.credit + body.n > WINDOW:
                    raise ProtocolError(f"stream {body.stream} acknowledged bytes it was not sent")
                st.credit += body.n
                st.more.set()
        elif kind == lm.RPC_CLOSE:
            self._end(body.stream, body.error, tell=False)
        else:
            return False
        return True

    def _end(self, sid: int, error: str, *, tell: bool = True) -> None:
        st = self.streams.pop(sid, None)
        if st is None:
            return
        if st.pump is not None:
            st.pump.cancel()
        st.writer.close()
        if tell and not self.link.closed:
            with contextlib.suppress(ConnectionError):
                self.link.send(lm.RpcClose(sid, error))

    def close(self) -> None:
        for sid in list(self.streams):
            self._end(sid, "", tell=False)
