"""Link F's secure channel, sans-I/O: Noise NNpsk0_25519_ChaChaPoly_BLAKE2s with the
pre-shared key SHA-256(fleet token); without a token, plaintext (loopback only, enforced by
the callers). Bytes in, events out:

    stream  = preamble | record*          record = u32 len | bytes (len <= 65535)
    preamble (initiator -> responder) = b"SFL1" + mode (b"E" Noise, b"P" plaintext)

The head always initiates. Handshake: record 1 (initiator: e, psk), record 2 (responder:
e, ee); then every record is one Noise transport message. A wrong token fails record 1's
authentication on the responder: both sides report it and close."""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING

from ..errors import ProtocolError

if TYPE_CHECKING:
    from noise.connection import NoiseConnection

PROTOCOL = b"Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s"
MAGIC = b"SFL1"
MAX_RECORD = 65535
MAX_PLAIN = MAX_RECORD - 16  # the AEAD tag
_LEN = struct.Struct("<I")


class AuthFailed(ProtocolError):
    """The peer holds a different fleet token (or none where one is required)."""
    code = "fleet_auth_failed"


def psk_of(token: str) -> bytes:
    return hashlib.sha256(token.strip().encode()).digest()


class SecureChannel:
    def __init__(self, *, initiator: bool, psk: bytes | None):
        self.initiator = initiator
        self.psk = psk
        self.ready = False  # handshake done: send() and received data flow
        self._buf = bytearray()
        self._got_preamble = initiator  # only the responder reads a preamble
        self._noise: NoiseConnection | None = None
        if psk is not None:  # imported here: a plaintext link (and every Link W) never needs it
            from noise.connection import NoiseConnection
            n = NoiseConnection.from_name(PROTOCOL)
            if initiator:
                n.set_as_initiator()
            else:
                n.set_as_responder()
            n.set_psks(psk)
            n.start_handshake()
            self._noise = n

    def start(self) -> bytes:
        """The initiator's first bytes (preamble and, with a token, handshake record 1)."""
        if not self.initiator:
            return b""
        out = MAGIC + (b"E" if self._noise else b"P")
        if self._noise is None:
            self.ready = True
            return out
        return out + _record(bytes(self._noise.write_message()))

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """Feed received bytes: (bytes to send back now, plaintext for the frame decoder).
        Raises AuthFailed on a token mismatch, ProtocolError on garbage."""
        self._buf += data
        reply, plain = bytearray(), bytearray()
        if not self._got_preamble:
            if len(self._buf) < 5:
                return b"", b""
            if bytes(self._buf[:4]) != MAGIC:
                raise ProtocolError("not a superfluid fleet link (bad preamble)")
            mode = bytes(self._buf[4:5])
            del self._buf[:5]
            self._got_preamble = True
            if mode == b"P" and self._noise is not None:
                raise AuthFailed("the head sent no fleet token, and this node requires one (--auth-file)")
            if mode == b"E" and self._noise is None:
                raise AuthFailed("the head uses a fleet token, and this node has none (--auth-file)")
            if mode not in (b"E", b"P"):
                raise ProtocolError(f"unknown link mode {mode!r}")
            if self._noise is None:
                self.ready = True
        while True:
            if self._noise is None and self.ready:
                plain += self._buf
                self._buf.clear()
                break
            if len(self._buf) < 4:
                break
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_RECORD:
                raise ProtocolError(f"record of {n} bytes is over the {MAX_RECORD}-byte cap")
            if len(self._buf) < 4 + n:
                break
            msg = bytes(self._buf[4:4 + n])
            del self._buf[:4 + n]
            assert self._noise is not None
            try:
                if not self.ready:
                    self._noise.read_message(msg)
                    if not self.initiator:
                        reply += _record(bytes(self._noise.write_message()))
                    self.ready = self._noise.handshake_finished
                else:
                    plain += self._noise.decrypt(msg)
            except Exception as e:  # the noise library raises cryptography's InvalidTag and others
                if not self.ready:
                    raise AuthFailed("the peer's fleet token differs (the handshake did not authenticate)") from e
                raise ProtocolError(f"a record failed to decrypt ({type(e).__name__})") from e
        return bytes(reply), bytes(plain)

    def send(self, plaintext: bytes) -> bytes:
        if not self.ready:
            raise ProtocolError("send before the handshake finished")
        if self._noise is None:
            return plaintext
        out = bytearray()
        for i in range(0, len(plaintext), MAX_PLAIN):
            out += _record(bytes(self._noise.encrypt(plaintext[i:i + MAX_PLAIN])))
        return bytes(out)


def _record(b: bytes) -> bytes:
    return _LEN.pack(len(b)) + b
