"""Link W messages: typed records over the shared connection layer (link/conn.py)."""

import msgpack
import pytest

from superfluid.errors import ProtocolError
from superfluid.link.conn import Connection
from superfluid.link.frame import Frame, FrameDecoder
from superfluid.plan import Run, Sampled, StepPlan, StepResult
from superfluid.request import SamplingParams
from superfluid.plan import LaneOpen
from superfluid.worker.protocol import (LINK_W, VERSION, Hello, HelloAck, Msg, Shutdown, WorkerError,
                                        WorkerSettings)

SETTINGS = WorkerSettings("/m.gguf", 4, 2048, 2, 256, runtime="pipeline", stages=(("h", 1), ("g", 2)),
                          spares=(("s", 3),), stage_psk=b"\x00\xff" * 16, split="memory", pooling="mean",
                          kv_dir="/kv", kv_disk_mb=1.5)
MESSAGES = [
    Hello((VERSION,), SETTINGS),
    HelloAck(VERSION, {"n_vocab": 49152, "name": "m"}, ((7, b"\x01\x00\x00\x00"),)),
    HelloAck(VERSION, {"n_vocab": 1}),
    StepPlan(3, opens=(LaneOpen(1, SamplingParams(), ns="key-a"), LaneOpen(2, SamplingParams(), persist=False)),
             runs=(Run(1, 0, (5, 6), True),)),
    StepResult(3, (Sampled(1, 9, -0.5, ((9, -0.5),)),)),
    WorkerError("boom", "stage_unavailable"),
    Shutdown(),
]


def through(msg, **kw):
    a, b = Connection(LINK_W), Connection(LINK_W)
    b.receive_data(a.send(msg, **kw))
    return b.next_event()


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_roundtrip_every_message_type(msg):
    kind, got = through(msg)
    assert kind == LINK_W.table.type_of(msg) and got == msg


def test_frame_header_carries_version_and_correlation():
    plan = StepPlan(9)
    (f,) = FrameDecoder().feed(Connection(LINK_W).send(plan, correlation=9))
    assert (f.version, f.msg_type, f.correlation) == (VERSION, int(Msg.STEP), 9)


def test_worker_settings_travel_whole():
    assert through(Hello((VERSION,), SETTINGS))[1].settings == SETTINGS
    plain = WorkerSettings("/m.gguf", 8, 1024, 1, 128)
    assert through(Hello((VERSION,), plain))[1].settings == plain


def test_unknown_required_type_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        Connection(LINK_W).receive_data(Frame(VERSION, 77, body=msgpack.packb(None)).encode())


def test_unknown_optional_type_is_dropped():
    c = Connection(LINK_W)
    c.receive_data(Frame(VERSION, 0x8000 | 77, body=b"\xc1garbage").encode())
    assert c.next_event() is None and c.dropped == 1


@pytest.mark.parametrize("version", [0, VERSION - 1, VERSION + 1, 0xFFFF])
def test_unsupported_version_is_a_protocol_error(version):
    with pytest.raises(ProtocolError):
        Connection(LINK_W).receive_data(Frame(version, int(Msg.HELLO), body=msgpack.packb({})).encode())


@pytest.mark.parametrize("body", [b"\xc1", b"\x92\x01", b"\x01\x02", b"", b"\xd9\x05ab"])
def test_garbage_body_is_a_protocol_error(body):
    with pytest.raises(ProtocolError):
        Connection(LINK_W).receive_data(Frame(VERSION, int(Msg.STEP), body=body).encode())


@pytest.mark.parametrize("body", [{}, {"versions": [1]}, {"versions": "x", "settings": {}},
                                  {"versions": [1], "settings": {"model": 3, "lanes": 1, "ctx": 1, "threads": 1,
                                                                 "batch_tokens": 1}}])
def test_malformed_hello_is_a_protocol_error(body):
    with pytest.raises(ProtocolError, match="malformed body"):
        Connection(LINK_W).receive_data(Frame(VERSION, int(Msg.HELLO), body=msgpack.packb(body)).encode())


def test_a_refusal_answers_hello_as_a_typed_error():
    from superfluid.link.conn import HELLO_ACK, Refused
    c = Connection(LINK_W)
    with pytest.raises(Refused) as e:
        c.check_ack(int(Msg.ERROR), WorkerError("cannot load", "model_load_error"))
    assert e.value.message == "cannot load" and e.value.reason == "model_load_error"
    with pytest.raises(Refused) as e:
        c.check_ack(int(Msg.ERROR), WorkerError("no such runtime"))
    assert e.value.reason is None
    assert c.check_ack(HELLO_ACK, HelloAck(VERSION, {})).version == VERSION
