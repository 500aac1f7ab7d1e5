"""Link F's socket code (the only fleet module that touches sockets): a TCP connection
with the secure channel and the frame envelope on top. Everything it parses comes from
link/ (sans-I/O); errors a peer can cause are ProtocolError / AuthFailed, or
ConnectionError when the connection ends."""

from __future__ import annotations

import asyncio
import contextlib

from ..errors import ProtocolError
from ..link.frame import Frame, FrameDecoder
from ..link.messages import HELLO, HELLO_ACK, KNOWN, OPTIONAL_BIT, VERSION, pack, unpack
from ..link.noise import SecureChannel

HANDSHAKE_TIMEOUT = 5.0


class Link:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, channel: SecureChannel):
        self.reader, self.writer, self.channel = reader, writer, channel
        self.decoder = FrameDecoder()
        self._frames: list[Frame] = []
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.closed = False

    @classmethod
    async def dial(cls, host: str, port: int, psk: bytes | None, timeout: float = HANDSHAKE_TIMEOUT) -> Link:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        link = cls(reader, writer, SecureChannel(initiator=True, psk=psk))
        try:
            writer.write(link.channel.start())
            await asyncio.wait_for(link._handshake(), timeout)
        except BaseException:
            link.close()
            raise
        return link

    @classmethod
    async def accept(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, psk: bytes | None,
                     timeout: float = HANDSHAKE_TIMEOUT, *, initiator: bool = False) -> Link:
        """A link over a connection someone else opened. The head initiates the secure
        channel whichever side dialed (a node that joins a head is the responder)."""
        link = cls(reader, writer, SecureChannel(initiator=initiator, psk=psk))
        try:
            if initiator:
                writer.write(link.channel.start())
            await asyncio.wait_for(link._handshake(), timeout)
        except BaseException:
            link.close()
            raise
        return link

    async def _handshake(self) -> None:
        while not self.channel.ready:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("the peer closed the connection during the handshake")
            reply, plain = self.channel.receive(data)
            if reply:
                self.writer.write(reply)
            if plain:
                self._frames += self.decoder.feed(plain)
        await self.writer.drain()

    async def hello(self, instance: str, timeout: float = 10.0) -> dict:
        """The head's greeting (whichever side dialed): HELLO with our versions and the head
        process's instance id; the node's HELLO_ACK."""
        self.send(HELLO, {"versions": [VERSION], "head": instance})
        kind, ack = await asyncio.wait_for(self.recv(), timeout)
        if kind != HELLO_ACK:
            raise ConnectionError(f"expected HELLO_ACK, got message {kind}")
        return ack

    def send(self, msg_type: int, body: dict) -> None:
        if self.closed:
            raise ConnectionError("the link is closed")
        self.writer.write(self.channel.send(Frame(VERSION, msg_type, body=pack(body)).encode()))

    async def recv(self) -> tuple[int, dict]:
        """The next message; optional types we do not know are skipped."""
        while True:
            while self._frames:
                f = self._frames.pop(0)
                if f.msg_type not in KNOWN:
                    if f.msg_type & OPTIONAL_BIT:
                        continue
                    raise ProtocolError(f"unknown required message type {f.msg_type}")
                return f.msg_type, unpack(f.body)
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("the peer closed the connection")
            reply, plain = self.channel.receive(data)
            if reply:
                self.writer.write(reply)
            self._frames += self.decoder.feed(plain)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.writer.close()
