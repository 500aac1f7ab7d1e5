"""Link W: the messages between daemon and worker, as frames with msgpack bodies.

Handshake: the daemon sends HELLO {versions}; the worker loads the model and answers
HELLO_ACK {version, info} (or ERROR). Then STEP (a StepPlan) -> STEP_RESULT, one at a time,
until SHUTDOWN."""

from __future__ import annotations

import enum
from typing import Any

import msgpack

from ..errors import ProtocolError
from ..link.frame import OPTIONAL, Frame

VERSION = 1
SUPPORTED = (1,)


class Msg(enum.IntEnum):
    HELLO = 1
    HELLO_ACK = 2
    STEP = 3
    STEP_RESULT = 4
    ERROR = 5
    SHUTDOWN = 6


def encode(msg: Msg, body: Any, *, seq: int = 0, correlation: int = 0) -> bytes:
    return Frame(VERSION, int(msg), seq, correlation, 0,
                 msgpack.packb(body, use_bin_type=True)).encode()


def decode(frame: Frame) -> tuple[Msg | None, Any]:
    """(message type, body); (None, None) for an unknown optional type."""
    if frame.version not in SUPPORTED:
        raise ProtocolError(f"Link W version {frame.version} is not supported")
    try:
        msg = Msg(frame.msg_type)
    except ValueError:
        if frame.msg_type & OPTIONAL:
            return None, None
        raise ProtocolError(f"unknown Link W message type {frame.msg_type}") from None
    try:
        return msg, msgpack.unpackb(frame.body, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types
        raise ProtocolError(f"bad {msg.name} body: {e}") from e
