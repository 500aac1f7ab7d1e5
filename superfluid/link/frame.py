"""The frame envelope shared by Link W and Link F.

    u32 len | u16 version | u16 msg_type | u64 seq | u64 correlation | u8 class | body

little-endian; `len` counts every byte after itself (21 header bytes + body); frames are
capped at 16 MiB. Message types with bit 0x8000 are optional: a peer that does not know
one may drop it; an unknown type without that bit is a fatal protocol error."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ProtocolError

HEADER = struct.Struct("<IHHQQB")
HEADER_AFTER_LEN = HEADER.size - 4
MAX_FRAME = 16 * 1024 * 1024
OPTIONAL = 0x8000


@dataclass(frozen=True, slots=True)
class Frame:
    version: int
    msg_type: int
    seq: int = 0
    correlation: int = 0
    klass: int = 0
    body: bytes = b""

    def encode(self) -> bytes:
        n = HEADER_AFTER_LEN + len(self.body)
        if n > MAX_FRAME:
            raise ProtocolError(f"frame of {n} bytes is over the {MAX_FRAME}-byte cap")
        return HEADER.pack(n, self.version, self.msg_type, self.seq, self.correlation,
                           self.klass) + self.body


class FrameDecoder:
    """Feed bytes as they arrive; take whole frames out. Raises ProtocolError on garbage."""

    def __init__(self, max_frame: int = MAX_FRAME):
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        out: list[Frame] = []
        while len(self._buf) >= 4:
            (n,) = struct.unpack_from("<I", self._buf)
            if n < HEADER_AFTER_LEN or n > self._max:
                raise ProtocolError(f"bad frame length {n}")
            if len(self._buf) < 4 + n:
                break
            _, ver, typ, seq, corr, klass = HEADER.unpack_from(self._buf)
            body = bytes(self._buf[HEADER.size:4 + n])
            del self._buf[:4 + n]
            out.append(Frame(ver, typ, seq, corr, klass, body))
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)
