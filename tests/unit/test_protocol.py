"""Link W messages: frames with msgpack bodies."""

import msgpack
import pytest

from superfluid.errors import ProtocolError
from superfluid.link.frame import Frame, FrameDecoder
from superfluid.worker.protocol import VERSION, Msg, decode, encode


def one_frame(raw: bytes) -> Frame:
    (f,) = FrameDecoder().feed(raw)
    return f


@pytest.mark.parametrize("msg", list(Msg))
def test_roundtrip_every_message_type(msg):
    body = {"versions": [1], "info": {"n_vocab": 49152, "name": "m"}, "blob": b"\x00\xff", "x": None}
    f = one_frame(encode(msg, body, seq=9, correlation=4))
    assert (f.version, f.msg_type, f.seq, f.correlation) == (VERSION, int(msg), 9, 4)
    assert decode(f) == (msg, body)


def test_int_map_keys_survive():
    assert decode(one_frame(encode(Msg.STEP_RESULT, {1: [2, 3]}))) == (Msg.STEP_RESULT, {1: [2, 3]})


def test_unknown_required_type_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        decode(Frame(VERSION, 77, body=msgpack.packb(None)))


def test_unknown_optional_type_is_dropped():
    assert decode(Frame(VERSION, 0x8000 | 77, body=b"\xc1garbage")) == (None, None)


@pytest.mark.parametrize("version", [0, 2, 0xFFFF])
def test_unsupported_version_is_a_protocol_error(version):
    with pytest.raises(ProtocolError):
        decode(Frame(version, int(Msg.HELLO), body=msgpack.packb({})))


@pytest.mark.parametrize("body", [b"\xc1", b"\x92\x01", b"\x01\x02", b"", b"\xd9\x05ab"])
def test_garbage_body_is_a_protocol_error(body):
    with pytest.raises(ProtocolError):
        decode(Frame(VERSION, int(Msg.STEP), body=body))
