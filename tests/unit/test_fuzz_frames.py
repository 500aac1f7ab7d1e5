"""Frame fuzzing (issue 14, "Proof, kept in the repo"): random and mutated frames and
msgpack bodies fed to the Link W and Link F decoders (link/frame.py, link/conn.py,
link/records.py, link/messages.py, worker/protocol.py). Pass: every malformed input is
answered with a typed SuperfluidError (ProtocolError), never another exception type."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superfluid.errors import SuperfluidError
from superfluid.link import messages as m
from superfluid.link.conn import KEEPALIVE, Connection
from superfluid.link.frame import HEADER, Frame, FrameDecoder
from superfluid.link.noise import SecureChannel
from superfluid.worker import protocol as w

FAST = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# msgpack-able values, nested, of every wire type (ints over 64 bits are not packable)
LEAF = (st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 64 - 1) | st.floats(allow_nan=True)
        | st.text(max_size=20) | st.binary(max_size=40))
VALUE = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=5)
                     | st.dictionaries(st.text(max_size=10) | st.integers(-5, 5), inner, max_size=5), max_leaves=25)


def field_names(cls) -> list[str]:
    return list(getattr(cls, "__dataclass_fields__", {}))


def body_for(cls):
    """A map over the class's own field names (so decoding reaches each field's converter)
    with arbitrary values, some fields left out, and sometimes an extra key."""
    names = field_names(cls)
    if not names:
        return VALUE
    return st.fixed_dictionaries({}, optional={n: VALUE for n in names}) | st.dictionaries(
        st.sampled_from(names) | st.text(max_size=8), VALUE, max_size=len(names) + 2) | VALUE


LINKS = {"W": w.LINK_W, "F": m.LINK_F}


def typed(fn, *args):
    """Run a decoder: it may return, or raise a SuperfluidError; anything else fails the test."""
    try:
        return fn(*args)
    except SuperfluidError:
        return None
    except RecursionError:  # pragma: no cover - the point of the test
        pytest.fail(f"{fn.__qualname__} raised RecursionError")
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{getattr(fn, '__qualname__', fn)} raised {type(e).__name__}: {e} for {args!r:.300}")


def drain(conn: Connection) -> None:
    while conn.next_event() is not None:
        pass


def frame_bytes(proto, msg_type: int, body: bytes, version: int | None = None) -> bytes:
    return Frame(proto.version if version is None else version, msg_type, body=body).encode()


# -- the frame envelope ---------------------------------------------------------------
@FAST
@given(data=st.binary(max_size=200), cap=st.sampled_from([64, 1 << 20]))
def test_frame_decoder_random_bytes(data, cap):
    typed(FrameDecoder(cap).feed, data)


@FAST
@given(n=st.integers(0, 2 ** 32 - 1), rest=st.binary(max_size=64), cuts=st.lists(st.integers(0, 80), max_size=4))
def test_frame_decoder_any_length_any_split(n, rest, cuts):
    """Any declared length, the bytes fed in arbitrary pieces: frames or ProtocolError."""
    data = struct.pack("<I", n) + rest
    dec = FrameDecoder()
    at = 0
    for c in sorted(cuts) + [len(data)]:
        if typed(dec.feed, data[at:c]) is None and dec.pending and at < c:
            pass
        at = max(at, c)


# -- Link W and Link F connections ----------------------------------------------------
def known_types(proto) -> list[int]:
    return sorted(proto.table.classes)


@FAST
@given(link=st.sampled_from(sorted(LINKS)), data=st.binary(max_size=300))
def test_connection_random_bytes(link, data):
    conn = Connection(LINKS[link])
    typed(conn.receive_data, data)
    drain(conn)


@FAST
@given(data=st.data(), link=st.sampled_from(sorted(LINKS)))
def test_connection_typed_message_random_body(data, link):
    """A well-framed message of every known type (and some unknown ones, required and
    optional) with an arbitrary msgpack body, or a body that is not msgpack."""
    proto = LINKS[link]
    msg_type = data.draw(st.sampled_from(known_types(proto)) | st.integers(0, 0xFFFF), label="type")
    cls = proto.table.classes.get(msg_type)
    body = data.draw(st.builds(lambda v: msgpack.packb(v, use_bin_type=True), body_for(cls))
                     | st.binary(max_size=40), label="body")
    version = data.draw(st.just(proto.version) | st.integers(0, 0xFFFF), label="version")
    conn = Connection(proto)
    typed(conn.receive_data, frame_bytes(proto, msg_type, body, version))
    drain(conn)


@FAST
@given(data=st.data(), link=st.sampled_from(sorted(LINKS)))
def test_deferred_records_decode_typed(data, link):
    """Every class of both tables (STEP, STEP_RESULT, the records) through Table.decode, and
    the deferred ones (stage records, NODE_PREFIXES) through the from_wire their handler
    runs: garbage is a ProtocolError."""
    proto = LINKS[link]
    classes = [c for c in proto.table.types if hasattr(c, "from_wire")]
    cls = data.draw(st.sampled_from(sorted(classes, key=lambda c: c.__name__)), label="class")
    body = data.draw(body_for(cls), label="body")
    typed(proto.table.decode, proto.table.types[cls], body)
    if proto.table.classes[proto.table.types[cls]] is None:  # deferred: the handler runs from_wire
        typed(cls.from_wire, body)


# valid messages of both links, to mutate
VALID = [
    (w.LINK_W, w.Hello((1,), w.WorkerSettings("m.gguf", 4, 1024, 1, 512))),
    (w.LINK_W, w.WorkerError("nope", "load_failed")),
    (w.LINK_W, w.Shutdown()),
    (m.LINK_F, m.Hello((1,), "head")),
    (m.LINK_F, m.GenerateCancel(3, "g")),
    (m.LINK_F, m.WatermarkAck("g", 1, 5)),
    (m.LINK_F, m.Reconcile({"g": (1, 4)})),
    (m.LINK_F, m.EmbedReq("e", (((1, 2, 3), 0),))),
    (m.LINK_F, m.StageLoad(0, 4)),
]


def mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    b = bytearray(data)
    for op, pos, val in ops:
        if not b:
            b.append(val)
            continue
        i = pos % len(b)
        if op == 0:
            b[i] = val
        elif op == 1:
            b[i] ^= 1 << (val % 8)
        elif op == 2:
            del b[i]
        elif op == 3:
            b.insert(i, val)
        else:
            del b[i:]
    return bytes(b)


OPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6)


@FAST
@given(which=st.integers(0, len(VALID) - 1), ops=OPS, body_only=st.booleans())
def test_mutated_valid_frames(which, ops, body_only):
    proto, msg = VALID[which]
    sender = Connection(proto)
    raw = sender.send(msg)
    if body_only:  # keep the envelope right, mutate the msgpack body inside it
        body = mutate(raw[HEADER.size:], ops)
        raw = frame_bytes(proto, proto.table.type_of(msg), body)
    else:
        raw = mutate(raw, ops)
    conn = Connection(proto)
    typed(conn.receive_data, raw)
    drain(conn)


def test_valid_frames_still_decode():
    """The baseline the mutations start from decodes (the fuzzer is not testing garbage only)."""
    for proto, msg in VALID:
        conn = Connection(proto)
        conn.receive_data(Connection(proto).send(msg))
        kind, got = conn.next_event()
        assert kind == proto.table.type_of(msg)
        assert type(got) is type(msg) or kind in (m.STAGE_LOAD,)


@FAST
@given(events=VALUE)
def test_token_event_chunks(events):
    """A TOKEN_EVENTS chunk (decoded by the head's handler with chunk_from_wire)."""
    typed(m.chunk_from_wire, "g", events)


@FAST
@given(v=VALUE | st.tuples(st.sampled_from(["float32", "float16", "int8"]), st.integers(-3, 5),
                           st.integers(-3, 5), st.binary(max_size=64)).map(list))
def test_stage_arrays(v):
    typed(m.unpack_array, v)


@FAST
@given(data=st.binary(max_size=100))
def test_unpack_link_f_body(data):
    typed(m.unpack, data)


def test_deep_nesting_body():
    """A msgpack body nested deeper than the recursion limit (msgpack's own limit) or than a
    converter will walk: typed."""
    deep = b"\x91" * 5000 + b"\xc0"  # 5000 nested one-element arrays
    for proto in LINKS.values():
        for t in known_types(proto):
            conn = Connection(proto)
            typed(conn.receive_data, frame_bytes(proto, t, deep))
            drain(conn)
    deepmap = b"\x81\xa1a" * 5000 + b"\xc0"
    for proto in LINKS.values():
        for t in known_types(proto):
            conn = Connection(proto)
            typed(conn.receive_data, frame_bytes(proto, t, deepmap))
            drain(conn)


def test_keepalive_any_body_is_consumed():
    conn = Connection(m.LINK_F)
    typed(conn.receive_data, frame_bytes(m.LINK_F, KEEPALIVE, msgpack.packb([1, 2, 3])))
    drain(conn)


# -- the secure channel (Link F over Noise) -------------------------------------------
@FAST
@given(data=st.binary(max_size=300), psk=st.sampled_from([None, b"k" * 32]))
def test_noise_responder_random_bytes(data, psk):
    """A node's secure channel fed garbage before and during the handshake."""
    node = Connection(m.LINK_F, SecureChannel(initiator=False, psk=psk))
    typed(node.receive_data, data)
    drain(node)


@FAST
@given(ops=OPS, psk=st.sampled_from([None, b"k" * 32]), after=st.booleans())
def test_noise_mutated_records(ops, psk, after):
    """Mutate the head's handshake, or a record after it: typed errors only."""
    head = Connection(m.LINK_F, SecureChannel(initiator=True, psk=psk))
    node = Connection(m.LINK_F, SecureChannel(initiator=False, psk=psk))
    first = head.start()
    if not after:
        typed(node.receive_data, mutate(first, ops))
        drain(node)
        return
    head.receive_data(node.receive_data(first))
    assert head.ready and node.ready
    rec = head.send(m.GenerateCancel(1, "g"))
    typed(node.receive_data, mutate(rec, ops))
    drain(node)
