"""The connection layer both links share, sans-I/O (h11's shape: bytes in, messages out).

A Connection is one end of Link W or Link F. It owns, for both:
- the secure channel where there is one (Link F: link/noise.py; Link W: none, a socketpair);
- framing (link/frame.py) and the frame version: a frame of another version is a
  ProtocolError, on either link;
- unknown message types: a required one is a ProtocolError, an optional one (bit 0x8000)
  is dropped;
- the body codec: msgpack, then the link's Table (link/records.py) into a typed message;
- HELLO: the initiator sends HELLO {versions, ...}; the responder checks that its version
  is among them (`check_hello`), answers HELLO_ACK {version, ...}, checked by the
  initiator (`check_ack`);
- keepalive and silence (Liveness): when a KEEPALIVE is due, and when a peer has been
  silent too long. KEEPALIVEs are consumed here; every message counts as heard.

net/transport.py is the I/O around it: the one place that reads a socket for either link."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import ProtocolError
from .frame import OPTIONAL, Frame, FrameDecoder
from .noise import SecureChannel
from .records import Record, Table

HELLO, HELLO_ACK = 1, 2  # the same numbers on both links
KEEPALIVE = OPTIONAL | 21  # optional: a peer that does not know it drops it


@dataclass(frozen=True)
class Protocol:
    """One link's contract: its name (for errors), its version and its message table."""
    name: str
    version: int
    table: Table
    keepalive: float | None = None  # seconds between KEEPALIVEs this end sends (None: none)
    silence: float | None = None  # a peer silent this long is gone (None: never)
    refusal: type | None = None  # the record a responder answers HELLO with instead of HELLO_ACK


class Refused(ProtocolError):
    """The responder answered HELLO with the link's refusal (a worker that cannot load);
    `reason` is the code the refusal carried (None: none)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


@dataclass
class Liveness:
    """The keepalive and silence decisions, on a clock the caller reads."""
    every: float | None
    silence: float | None
    last_heard: float = 0.0
    last_sent: float = 0.0

    def heard(self, now: float) -> None:
        self.last_heard = now

    def sent(self, now: float) -> None:
        self.last_sent = now

    def keepalive_due(self, now: float) -> bool:
        return self.every is not None and now - self.last_sent >= self.every

    def silent(self, now: float) -> bool:
        return self.silence is not None and now - self.last_heard > self.silence


def pack(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def unpack(data: bytes, what: str = "a body") -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"{what} is not msgpack ({type(e).__name__})") from None


@dataclass
class Connection:
    proto: Protocol
    channel: SecureChannel | None = None
    dropped: int = 0  # optional messages of types this end does not know
    _decoder: FrameDecoder = field(default_factory=FrameDecoder)
    _events: deque = field(default_factory=deque)

    @property
    def ready(self) -> bool:
        """The secure channel's handshake is done (always, without one)."""
        return self.channel is None or self.channel.ready

    def start(self) -> bytes:
        """The initiator's first bytes (the secure channel's preamble and handshake)."""
        return self.channel.start() if self.channel is not None else b""

    def receive_data(self, data: bytes) -> bytes:
        """Feed received bytes; returns bytes to send back now (handshake records). Whole
        messages queue for next_event. Raises ProtocolError (AuthFailed) on anything bad."""
        reply = b""
        if self.channel is not None:
            reply, data = self.channel.receive(data)
        for f in self._decoder.feed(data) if data else ():
            self._accept(f)
        return reply

    def _accept(self, f: Frame) -> None:
        name = self.proto.name
        if f.version != self.proto.version:
            raise ProtocolError(f"{name} frame version {f.version} is not supported (this end speaks "
                                f"{self.proto.version})")
        if f.msg_type not in self.proto.table:
            if f.msg_type & OPTIONAL:
                self.dropped += 1
                return
            raise ProtocolError(f"unknown required message type {f.msg_type} on {name}")
        body = unpack(f.body, f"a {name} body of message {f.msg_type}")
        if f.msg_type == KEEPALIVE:
            self._events.append((KEEPALIVE, None))
            return
        self._events.append((f.msg_type, self.proto.table.decode(f.msg_type, body)))

    def next_event(self) -> tuple[int, Any] | None:
        """The next (message type, typed message or raw body); None: more bytes needed."""
        return self._events.popleft() if self._events else None

    def send(self, msg: Any, *, correlation: int = 0) -> bytes:
        """The bytes that carry one typed message."""
        body = msg.to_wire() if hasattr(msg, "to_wire") else msg
        return self.send_raw(self.proto.table.type_of(msg), body, correlation=correlation)

    def send_raw(self, msg_type: int, body: Any, *, correlation: int = 0) -> bytes:
        """The bytes that carry a raw body (types without a class, and tests)."""
        if self.channel is not None and not self.channel.ready:
            raise ProtocolError("send before the handshake finished")
        frame = Frame(self.proto.version, msg_type, correlation=correlation, body=pack(body)).encode()
        return self.channel.send(frame) if self.channel is not None else frame

    def keepalive(self) -> bytes:
        return self.send_raw(KEEPALIVE, {})

    # -- HELLO -------------------------------------------------------------------------
    def check_hello(self, kind: int, hello: Any) -> Any:
        """The responder's check of the first message: a HELLO naming our version."""
        if kind != HELLO or self.proto.version not in getattr(hello, "versions", ()):
            raise ProtocolError(f"expected HELLO with {self.proto.name} version {self.proto.version}, "
                                f"got message {kind}")
        return hello

    def check_ack(self, kind: int, ack: Any) -> Any:
        """The initiator's check of the answer to its HELLO."""
        if self.proto.refusal is not None and isinstance(ack, self.proto.refusal):
            raise Refused(str(getattr(ack, "message", ack)), getattr(ack, "code", None))
        if kind != HELLO_ACK:
            raise ProtocolError(f"expected HELLO_ACK, got message {kind}")
        if getattr(ack, "version", self.proto.version) != self.proto.version:
            raise ProtocolError(f"the peer speaks {self.proto.name} version {ack.version}, not "
                                f"{self.proto.version}")
        return ack


__all__ = ["HELLO", "HELLO_ACK", "KEEPALIVE", "Connection", "Liveness", "Protocol", "Record", "Refused", "pack",
           "unpack"]
