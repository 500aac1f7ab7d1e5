"""The connection layer both links share (link/conn.py, net/transport.py) and the record codec
(link/records.py): framing, versions, HELLO, unknown types, keepalive and silence, and
typed messages that round-trip or fail as ProtocolError."""

import asyncio
import dataclasses
import socket

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superfluid.errors import ProtocolError
from superfluid.link import messages as m
from superfluid.link.conn import HELLO_ACK, KEEPALIVE, Connection, Liveness
from superfluid.link.frame import Frame
from superfluid.link.noise import SecureChannel
from superfluid.request import Chunk, FinishReason, SamplingParams
from superfluid.net.transport import Link


def pair(psk: bytes | None = b"k" * 32) -> tuple[Connection, Connection]:
    """A head and a node, secure channel done."""
    head = Connection(m.LINK_F, SecureChannel(initiator=True, psk=psk))
    node = Connection(m.LINK_F, SecureChannel(initiator=False, psk=psk))
    reply = node.receive_data(head.start())
    head.receive_data(reply)
    assert head.ready and node.ready
    return head, node


RECORDS = [
    m.Hello((1,), "h"),
    m.HelloAck(1, "n", (m.ModelOffer("x", 2048, 4, 512, "embed"),), m.NodeStatus(lanes=4, running=1, rates=[1.5, 2])),
    m.HelloAck(1, "stage", stage={"model": "x", "n_layer": 30, "mem": 1 << 30}),
    m.GenerateReq(5, "g", "s", 7, (1, 2, 3), SamplingParams(temperature=0.5).to_wire(), 16, ("\n",), 0,
                  {"tools": None, "reasoning": None}, (4,)),
    m.GenerateCancel(6, "g"),
    m.TokenEvents("g", 7, ((0, m.chunk_to_wire(Chunk("g", text="hi", tokens=[1]))),
                           (1, m.chunk_to_wire(Chunk("g", finish=FinishReason.LENGTH))))),
    m.WatermarkAck("g", 7, 1),
    m.Reconcile({"g": (7, 1), "h": (2, -1)}),
    m.ReconcileAck(("g",)),
    m.SessionRevoke("s", 9),
    m.NodeStatus(lanes=2, queue={"agent": 1}, stages=[[0, 15]]),
    m.EmbedReq("m#1", (((1, 2, 3), 0), ((4, 5), 1)), 4),
    m.EmbedResp("m#1", vectors=(b"\x00" * 8, b"\x01" * 8)),
    m.EmbedResp("m#2", error=("embedding_unsupported", "no")),
]


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_round_trips_over_a_secure_link(rec):
    head, node = pair()
    node.receive_data(head.send(rec))
    kind, got = node.next_event()
    assert kind == type(rec).TYPE and got == rec


def test_records_keep_the_maps_link_f_always_carried():
    assert m.WatermarkAck("g", 1, 2).to_wire() == {"gen": "g", "epoch": 1, "upto": 2}
    assert m.NodeStatus(lanes=1).to_wire() == {"lanes": 1}  # optional fields left off while None
    assert m.Hello.from_wire({"versions": [1]}) == m.Hello((1,))  # a default fills what an old peer leaves off
    assert m.GenerateCancel.from_wire({"cmd": 1, "gen": "g", "future": 3}) == m.GenerateCancel(1, "g")
    assert m.EmbedResp("x", error=("c", "m")).to_wire() == {"id": "x", "error": ["c", "m"]}


@pytest.mark.parametrize("cls,body", [
    (m.GenerateReq, {"cmd": 1}), (m.GenerateReq, {"cmd": "x", "gen": 3}), (m.WatermarkAck, {"gen": "g"}),
    (m.Reconcile, {"gens": {"g": "nope"}}), (m.Reconcile, {"gens": {"g": [1]}}), (m.SessionRevoke, {}),
    (m.TokenEvents, {"gen": "g", "epoch": 1, "events": [[0]]}), (m.HelloAck, {"version": True}),
    (m.HelloAck, {"version": 1, "models": [{"n_ctx": 3}]}), (m.GenerateCancel, [1, "g"]),
    (m.WatermarkAck, {"gen": "g", "epoch": 1.5, "upto": 0}),
    (m.EmbedReq, {"id": "x", "inputs": [[[1, "a"], 0]]}), (m.EmbedResp, {"id": "x", "error": ["c"]}),
])
def test_malformed_records_are_protocol_errors(cls, body):
    with pytest.raises(ProtocolError, match="malformed body"):
        cls.from_wire(body)


@settings(max_examples=300, deadline=None)
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
                         lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20),
       rec=st.sampled_from(m.RECORDS))
def test_any_body_decodes_or_is_a_protocol_error(body, rec):
    try:
        rec.from_wire(body)
    except ProtocolError:
        pass


def test_a_frame_of_another_version_is_fatal_on_link_f():
    head, node = pair()
    with pytest.raises(ProtocolError, match="version 2"):
        node.receive_data(head.channel.send(Frame(2, m.GENERATE_CANCEL, body=msgpack.packb({})).encode()))


def test_unknown_types_required_fatal_optional_dropped():
    head, node = pair(None)
    node.receive_data(head.send_raw(0x8000 | 99, {"x": 1}) + head.send(m.GenerateCancel(1, "g")))
    assert node.next_event() == (m.GENERATE_CANCEL, m.GenerateCancel(1, "g")) and node.dropped == 1
    with pytest.raises(ProtocolError, match="unknown required message type 999"):
        node.receive_data(head.send_raw(999, {}))


@pytest.mark.parametrize("data", [b"\xff" * 64, b"\x05\x00\x00\x00\x01\x00\x02\x00\x00", b"SFL1X"])
def test_garbage_bytes_are_protocol_errors(data):
    node = Connection(m.LINK_F, SecureChannel(initiator=False, psk=None))
    with pytest.raises(ProtocolError):
        node.receive_data(data)


def test_garbage_after_the_handshake_is_a_protocol_error():
    head, node = pair(None)
    with pytest.raises(ProtocolError):
        node.receive_data(Frame(1, m.GENERATE_CANCEL, body=b"\xc1").encode())


def test_hello_checks_versions_on_both_ends():
    head, node = pair()
    assert node.check_hello(m.HELLO, m.Hello((1, 2), "h")).head == "h"
    with pytest.raises(ProtocolError, match="expected HELLO"):
        node.check_hello(m.HELLO, m.Hello((2,), "h"))
    with pytest.raises(ProtocolError, match="expected HELLO"):
        node.check_hello(m.GENERATE_CANCEL, m.GenerateCancel(1, "g"))
    assert head.check_ack(HELLO_ACK, m.HelloAck(1)).version == 1
    with pytest.raises(ProtocolError, match="version 3"):
        head.check_ack(HELLO_ACK, m.HelloAck(3))


def test_keepalives_are_consumed_and_liveness_decides():
    head, node = pair(None)
    node.receive_data(head.keepalive())
    assert node.next_event() == (KEEPALIVE, None)
    live = Liveness(every=1.0, silence=5.0, last_heard=0.0, last_sent=0.0)
    assert not live.keepalive_due(0.5) and live.keepalive_due(1.0)
    live.sent(1.0)
    assert not live.keepalive_due(1.9) and not live.silent(5.0) and live.silent(5.1)
    live.heard(5.0)
    assert not live.silent(9.9)
    assert not Liveness(None, None).keepalive_due(1e9) and not Liveness(None, None).silent(1e9)


def test_a_silent_peer_is_dropped_and_keepalives_keep_a_link_up():
    async def run() -> tuple[str, int]:
        a, b = socket.socketpair()
        quiet = dataclasses.replace(m.LINK_F, keepalive=None, silence=None)
        chatty = dataclasses.replace(m.LINK_F, keepalive=0.05, silence=0.3)
        watcher, peer = await Link.over(a, chatty), await Link.over(b, quiet)
        got: list[int] = []
        peer_task = asyncio.create_task(peer.serve(lambda k, body: got.append(k)))
        await asyncio.sleep(0.2)  # the watcher's keepalives flow; the peer's handler never sees them
        with pytest.raises(ConnectionError, match="silent"):
            await asyncio.wait_for(watcher.serve(lambda k, body: None), 5)
        peer_task.cancel()
        return str(watcher.closed), len(got) + peer.conn.dropped
    assert asyncio.run(run()) == ("True", 0)


def test_a_handler_that_chokes_on_a_body_ends_the_link_with_a_protocol_error():
    async def run() -> None:
        a, b = socket.socketpair()
        x, y = await Link.over(a, m.LINK_F), await Link.over(b, m.LINK_F)
        x.send_raw(m.EMBED_REQ, {"id": 1})

        def handler(kind, body):
            body["inputs"]  # a raw body without a field the handler needs
        with pytest.raises(ProtocolError, match="malformed body"):
            await asyncio.wait_for(y.serve(handler), 5)
        x.close()
        y.close()
    asyncio.run(run())


def test_hello_over_loopback_tcp_with_the_secure_channel():
    """The head dials, greets; the node accepts, welcomes; a HELLO naming only another
    version is refused by the node, and an ACK of another version by the head."""
    async def run() -> list:
        psk = b"p" * 32
        out: list = []

        async def on_connect(reader, writer):
            link = await Link.accept(reader, writer, m.LINK_F, psk)
            try:
                hello = await link.welcome(5)
                out.append(hello.head)
                link.send(m.HelloAck(1 if hello.head != "old" else 9, "node"))
                await link.drain()
            except ProtocolError as e:
                out.append(e.message)
            await asyncio.sleep(0.1)
            link.close()
        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        head = await Link.dial("127.0.0.1", port, m.LINK_F, psk)
        out.append((await head.greet(m.Hello((1,), "h"))).node)
        head.close()
        other = await Link.dial("127.0.0.1", port, m.LINK_F, psk)
        other.send(m.Hello((7,), "x"))
        await asyncio.sleep(0.2)
        other.close()
        old = await Link.dial("127.0.0.1", port, m.LINK_F, psk)
        try:
            await old.greet(m.Hello((1,), "old"))
        except ProtocolError as e:
            out.append(e.message)
        old.close()
        server.close()
        return out
    out = asyncio.run(run())
    assert out[:2] == ["h", "node"]
    assert "expected HELLO with Link F version 1" in out[2]
    assert out[3] == "old" and "version 9" in out[4]


@pytest.mark.parametrize("rec", [
    m.StageLoad(0, 15), m.StageReady(0, 15, 10, 30, 49152, 576, 8192), m.StageReady(error="no"),
    m.StageForwardReq(3, (("s", 0, (1, 2), None, True), (7, 2, None, ["float32", 1, 2, b"\0" * 8], False))),
    m.StageForwardResp(3, (None, ["float32", 1, 2, b"\0" * 8])), m.StageForwardResp(3, error="boom"),
    m.StageCopy(1, 2, 5), m.StageDrop(("s", 7)),
], ids=lambda r: type(r).__name__)
def test_stage_records_travel_typed_and_their_handler_decodes_them(rec):
    """Deferred: the link hands the stage the raw map, so a malformed request gets an
    error reply instead of costing the link."""
    head, node = pair(None)
    node.receive_data(head.send(rec))
    kind, body = node.next_event()
    assert kind == type(rec).TYPE and isinstance(body, dict) and type(rec).from_wire(body) == rec


@pytest.mark.parametrize("cls,body", [(m.StageLoad, {"first": "x"}), (m.StageForwardReq, {"id": 4, "items": "junk"}),
                                      (m.StageCopy, {"src": 1, "dst": 2, "n": "3"}), (m.StageDrop, {})])
def test_malformed_stage_requests_are_protocol_errors(cls, body):
    with pytest.raises(ProtocolError, match="malformed body"):
        cls.from_wire(body)
