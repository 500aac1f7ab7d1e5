"""Link F's pure parts: the session-layer state machines under a hostile network
(hypothesis drops, duplicates, reorders and disconnects), the secure channel, and fuzzing
of everything that parses bytes from a peer."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from superfluid.errors import BadRequest, ContextLengthExceeded, ProtocolError, WorkerCrashed
from superfluid.link.frame import Frame, FrameDecoder
from superfluid.link.head_state import GIVE_UP_S, Counter, Tracker
from superfluid.link.messages import chunk_from_wire, chunk_to_wire, pack, unpack
from superfluid.link.node_state import NodeState, expired
from superfluid.link.noise import AuthFailed, SecureChannel, psk_of
from superfluid.request import Chunk, FinishReason

ACTIONS = st.lists(st.tuples(st.sampled_from(["deliver", "drop", "dup", "swap", "ack", "disconnect", "emit"]),
                             st.integers(0, 3)), max_size=200)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 40), actions=ACTIONS)
def test_every_event_arrives_exactly_once_in_order(n, actions):
    node, head = NodeState(), Tracker("s/g", epoch=1)
    buf = node.open("s/g", 1)
    wire: list[tuple[int, int, int]] = []  # (epoch, seq, payload) in flight to the head
    got: list[int] = []
    emitted = 0

    def emit():
        nonlocal emitted
        if emitted < n:
            seq, payload = buf.emit(emitted, last=emitted == n - 1)
            wire.append((1, seq, payload))
            emitted += 1

    def deliver(i):
        e, seq, payload = wire.pop(i)
        if head.accept(e, seq):
            got.append(payload)

    for act, k in actions:
        if act == "emit":
            emit()
        elif act == "deliver" and wire:
            deliver(min(k, len(wire) - 1))
        elif act == "drop" and wire:
            wire.pop(min(k, len(wire) - 1))
        elif act == "dup" and wire:
            wire.append(wire[min(k, len(wire) - 1)])
        elif act == "swap" and len(wire) > 1:
            wire[0], wire[-1] = wire[-1], wire[0]
        elif act == "ack":
            node.ack("s/g", 1, head.watermark)
        elif act == "disconnect":  # everything in flight is lost; the head reconciles
            wire.clear()
            resend, missing = node.reconcile({"s/g": (1, head.watermark)})
            assert not missing or buf.finished
            for b, tail in resend:
                wire += [(b.epoch, s, p) for s, p in tail]
    while emitted < n:
        emit()
    for _ in range(3):  # the network heals: reconcile until everything is in
        wire.clear()
        resend, _ = node.reconcile({"s/g": (1, head.watermark)})
        for b, tail in resend:
            for s, p in tail:
                if head.accept(b.epoch, s):
                    got.append(p)
    assert got == list(range(n))


def test_stale_epochs_are_fenced_on_both_sides():
    node = NodeState()
    assert node.admit("s", 2) and node.admit("s", 2) and not node.admit("s", 1)
    node.open("s/a", 1, "s")
    node.open("s/b", 3, "s")
    node.open("t/a", 1, "t")
    assert node.revoke("s", 3) == ["s/a"]
    t = Tracker("s/a", 1)
    t.replace(2)
    assert not t.accept(1, 0) and t.accept(2, 0)
    with pytest.raises(ValueError):
        t.replace(2)


def test_commands_apply_at_most_once():
    node = NodeState()
    assert node.first_time(7) and not node.first_time(7) and node.first_time(8)
    # another head (a moved or second head, whose counter starts from its own floor) is not a resend
    assert node.first_time(7, "head-b") and not node.first_time(7, "head-b")
    c = Counter(41)
    assert [c.next(), c.next()] == [42, 43]


def test_a_finished_generation_is_forgotten_once_acknowledged():
    node = NodeState()
    b = node.open("s/g", 1)
    b.emit("a")
    b.emit("b", last=True)
    node.ack("s/g", 1, 0)
    assert "s/g" in node.gens
    node.ack("s/g", 1, 1)
    assert "s/g" not in node.gens
    assert node.reconcile({"s/g": (1, 1)}) == ([], ["s/g"])


def handshake(head_psk, node_psk):
    h, n = SecureChannel(initiator=True, psk=head_psk), SecureChannel(initiator=False, psk=node_psk)
    reply, _ = n.receive(h.start())
    back, _ = h.receive(reply)
    assert back == b""
    return h, n


def test_secure_channel_round_trip_and_big_frames():
    h, n = handshake(psk_of("tok"), psk_of("tok"))
    assert h.ready and n.ready
    big = bytes(range(256)) * 1000  # spans several Noise records
    _, plain = n.receive(h.send(big))
    assert plain == big
    _, plain = h.receive(n.send(b"back"))
    assert plain == b"back"


@pytest.mark.parametrize("head,node", [("a", "b"), (None, "b"), ("a", None)])
def test_a_wrong_or_missing_token_fails_the_handshake(head, node):
    with pytest.raises(AuthFailed):
        handshake(psk_of(head) if head else None, psk_of(node) if node else None)


def test_plaintext_mode():
    h, n = handshake(None, None)
    _, plain = n.receive(h.send(b"hello"))
    assert plain == b"hello"


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_garbage_only_ever_raises_protocol_errors(data):
    for psk in (None, psk_of("x")):
        n = SecureChannel(initiator=False, psk=psk)
        try:
            n.receive(data)
        except ProtocolError:
            pass
    try:
        FrameDecoder(max_frame=1 << 16).feed(data)
    except ProtocolError:
        pass
    try:
        unpack(data)
    except ProtocolError:
        pass
    try:
        chunk_from_wire("r", unpack(data).get("c"))  # type: ignore[arg-type]
    except (ProtocolError, AttributeError):
        pass


def test_chunks_survive_the_wire():
    c = Chunk("r", text="hé", tokens=[1, 2], finish=FinishReason.LENGTH, prompt_tokens=3, completion_tokens=2,
              cached_tokens=1, ttft_s=0.5, reasoning="hm")
    back = chunk_from_wire("r", unpack(pack({"c": chunk_to_wire(c)}))["c"])
    assert back == c
    f = Frame(1, 12, body=pack({"x": 1}))
    assert FrameDecoder().feed(f.encode()) == [f]


def test_a_requests_own_error_keeps_its_type_across_link_f():
    """A node's typed refusal (errors.LINKED) is the same 4xx at the head; any other error
    is the node's fault (a 5xx naming its code); an old node's [code, message] still reads."""
    def across(err) -> Exception:
        back = chunk_from_wire("r", unpack(pack({"c": chunk_to_wire(Chunk("r", finish=FinishReason.ERROR,
                                                                           error=err))}))["c"])
        assert back.finish == FinishReason.ERROR and back.error is not None
        return back.error
    e = across(BadRequest("the grammar does not compile", param="response_format", code="bad_grammar"))
    assert type(e) is BadRequest and e.status == 400
    assert (e.message, e.param, e.code) == ("the grammar does not compile", "response_format", "bad_grammar")
    e = across(ContextLengthExceeded("too long", param="messages"))
    assert type(e) is ContextLengthExceeded and e.status == 400 and e.param == "messages"
    e = across(RuntimeError("the arena is corrupt"))
    assert type(e) is WorkerCrashed and e.status >= 500 and e.code == "node_error"
    assert "RuntimeError: the arena is corrupt" in e.message
    old = chunk_to_wire(Chunk("r", finish=FinishReason.ERROR))
    old[-1] = ["queue_full", "busy"]
    e = chunk_from_wire("r", old).error
    assert type(e) is WorkerCrashed and e.code == "queue_full" and "busy" in e.message
    old[-1] = ["a", "b", "c"]
    with pytest.raises(ProtocolError):
        chunk_from_wire("r", old)


def test_failover_waits_for_the_grace_and_a_refusal_moves_at_once():
    t = Tracker("s/g", epoch=3)
    assert not t.failover_due(100.0, grace=1.0)
    t.lost(10.0)
    assert not t.failover_due(11.0, grace=1.0) and t.failover_due(11.5, grace=1.0)
    t.lost(11.2)  # a second loss never delays the first
    assert t.lost_at == 10.0
    t.found()  # the node came back and reconciled
    assert not t.failover_due(1e9, grace=1.0) and not t.hopeless(1e9, grace=1.0)
    t.lost(50.0)
    t.lost(0.0)  # the node says it no longer has the generation: move now
    assert t.failover_due(0.5 + 1.0, grace=1.0)
    t.replace(4)  # re-placed: a new epoch, placed and up
    assert t.lost_at is None and t.next_seq == 0


def test_a_lost_generation_is_given_up_only_after_its_grace_and_the_wait():
    t = Tracker("s/g", epoch=1)
    t.lost(100.0)
    assert not t.hopeless(100.0 + 1.0 + GIVE_UP_S, grace=1.0)
    assert t.hopeless(100.0 + 1.0 + GIVE_UP_S + 0.1, grace=1.0)


def test_leases_expire_on_their_heads_silence():
    heard = {"a": 100.0, "b": 95.0, "c": 89.0}
    assert expired(heard, 100.0, lease_s=10.0) == ["c"]
    assert expired(heard, 105.5, lease_s=10.0) == ["b", "c"]
    assert expired({}, 1e9, lease_s=10.0) == []
