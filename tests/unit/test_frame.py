"""The frame envelope: encode/decode, incremental feeding, and garbage."""

import struct

import pytest

from superfluid.errors import ProtocolError
from superfluid.link.frame import HEADER, HEADER_AFTER_LEN, MAX_FRAME, Frame, FrameDecoder

F1 = Frame(1, 3, seq=2**64 - 1, correlation=12345, klass=7, body=b"hello\x00world")
F2 = Frame(1, 0x8001, seq=1, body=b"")


def test_header_layout_is_little_endian_with_length_after_itself():
    raw = F1.encode()
    assert HEADER.size == 25 and HEADER_AFTER_LEN == 21
    (n,) = struct.unpack_from("<I", raw)
    assert n == len(raw) - 4 == 21 + len(F1.body)
    assert raw[4:6] == b"\x01\x00" and raw[6:8] == b"\x03\x00"
    assert raw.endswith(F1.body)


def test_roundtrip():
    d = FrameDecoder()
    assert d.feed(F1.encode()) == [F1]
    assert d.pending == 0


def test_byte_by_byte_feeding():
    d = FrameDecoder()
    raw = F1.encode()
    out = []
    for i in range(len(raw)):
        got = d.feed(raw[i:i + 1])
        if i < len(raw) - 1:
            assert got == [] and d.pending == i + 1
        out += got
    assert out == [F1] and d.pending == 0


def test_several_frames_in_one_feed_and_a_partial_tail():
    d = FrameDecoder()
    tail = F1.encode()
    assert d.feed(F1.encode() + F2.encode() + tail[:10]) == [F1, F2]
    assert d.pending == 10
    assert d.feed(tail[10:]) == [F1]
    assert d.pending == 0


@pytest.mark.parametrize("n", [0, 20])
def test_length_below_the_header_is_a_protocol_error(n):
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack("<I", n) + b"\x00" * 40)


def test_length_over_the_cap_is_refused_before_the_body_arrives():
    d = FrameDecoder(max_frame=100)
    with pytest.raises(ProtocolError):
        d.feed(struct.pack("<I", 101))
    assert FrameDecoder(max_frame=100).feed(Frame(1, 1, body=b"x" * 79).encode())  # exactly 100


def test_default_cap_refuses_a_huge_length():
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack("<I", MAX_FRAME + 1))


def test_encode_refuses_a_frame_over_the_cap():
    body = b"\x00" * (MAX_FRAME - HEADER_AFTER_LEN + 1)
    with pytest.raises(ProtocolError):
        Frame(1, 1, body=body).encode()


def test_encode_accepts_a_frame_exactly_at_the_cap():
    raw = Frame(1, 1, body=b"\x00" * (MAX_FRAME - HEADER_AFTER_LEN)).encode()
    assert len(raw) == MAX_FRAME + 4
