"""The session fold and the event encoding, with no store and no model."""

import pytest

from superfluid.session.events import (Created, EpochBump, Event, Generated, GenerationPrompt, Message, Meta, Purge,
                                       ToolResult, ToolUse, Trim, decode, encode)
from superfluid.session.state import fold

BODIES = [
    Created(None, None, {"model": "m", "sampling": {"seed": 3}}),
    Message("user", "hi", (1, 2, 3)),
    GenerationPrompt((4, 5)),
    Generated((6,), "a", None),
    Generated((7, 0), "b", "end_of_turn"),
    ToolUse("get", '{"x": 1}', "call_1"),
    ToolResult("call_1", "42", (8, 9)),
    EpochBump(3),
    Meta("title", True),
    Trim(4),
    Purge(),
]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: type(b).__name__)
def test_every_event_round_trips(body):
    kind, data = encode(body)
    assert isinstance(data, bytes)
    assert decode(kind, data) == body


def test_decode_refuses_unknown_kinds_and_garbage():
    with pytest.raises(ValueError):
        decode("nope", encode(Purge())[1])
    with pytest.raises(ValueError):
        decode("message", b"\x93\x01\x02\x03")  # a msgpack list, not a map


def evs(*bodies, epoch=1):
    return [Event(i, epoch, float(i), b) for i, b in enumerate(bodies)]


def decode_tokens(tokens):
    return "".join(chr(96 + t) for t in tokens if t)  # 1 -> a, 0 (end of turn) -> nothing


def test_context_is_the_concatenation_of_spans():
    st = fold("s", evs(Created(), Message("system", "sys", (1,)), Message("user", "u", (2, 3)),
                      GenerationPrompt((4,)), Generated((5,), "e"), Generated((6,), "f")))
    assert st.tokens == [1, 2, 3, 4, 5, 6]
    assert st.next_id == 6
    assert st.turn_open and st.turn_tokens == 2


def test_turns_open_and_close():
    base = [Created(), Message("user", "u", (1,)), GenerationPrompt((2,))]
    assert fold("s", evs(*base)).turn_open  # opener committed, nothing generated yet
    for finish, still_open in [(None, True), ("length", True), ("cancelled", True), ("error", True),
                               ("end_of_turn", False), ("stop_sequence", False)]:
        st = fold("s", evs(*base, Generated((3,), "c", finish)))
        assert st.turn_open is still_open, finish
        assert st.last_finish == finish
    st = fold("s", evs(*base, Generated((3,), "c", finish="length"), Message("user", "again", (4,))))
    assert not st.turn_open  # a user message after a cut turn: the next generation opens a new one


def test_epoch_bump_keeps_a_cut_turn_open():
    st = fold("s", evs(Created(), Message("user", "u", (1,)), GenerationPrompt((2,)), Generated((3,), "c"),
                      EpochBump(2)))
    assert st.epoch == 2 and st.turn_open and st.tokens == [1, 2, 3]


def test_conversation_for_the_template():
    st = fold("s", evs(Created(), Message("system", "sys", (1,)), Message("user", "hello", (2,)),
                      GenerationPrompt((9,)), Generated((3,), "c"), Generated((4, 0), "d", finish="end_of_turn"),
                      ToolUse("get", "{}", "c1"), ToolResult("c1", "42", (5,))))
    conv = st.conversation(decode_tokens)
    assert conv == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "cd",
                     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}]},
                    {"role": "tool", "content": "42", "tool_call_id": "c1"}]


def test_trim_drops_later_context_but_not_the_log():
    st = fold("s", evs(Created(), Message("user", "u", (1, 2)), GenerationPrompt((3,)),
                      Generated((4,), "d"), Generated((5, 0), "e", finish="end_of_turn"), Trim(2)))
    assert st.tokens == [1, 2, 3]
    assert st.turn_open  # back to just after the opener: generating opens nothing new
    assert st.next_id == 6
    st2 = fold("s", evs(Created(), Message("user", "u", (1, 2)), Trim(0)))
    assert st2.tokens == [] and not st2.turn_open


def test_meta_and_purge():
    st = fold("s", evs(Created(), Meta("a", None), Meta(None, True)))
    assert (st.title, st.archived, st.purged) == ("a", True, False)
    assert fold("s", evs(Created(), Purge())).purged


def test_a_fork_folds_the_parent_prefix_then_its_own_events():
    parent = evs(Created(params={"p": 1}), Message("user", "u", (1,)), GenerationPrompt((2,)), Generated((3,), "c"))
    own = [Event(3, 1, 3.0, Created("parent", 2, {"p": 1})), Event(4, 1, 4.0, Generated((7,), "x"))]
    st = fold("f", parent[:3] + own)
    assert st.parent == "parent" and st.fork_at == 2
    assert st.tokens == [1, 2, 7]


def test_events_out_of_order_are_refused():
    with pytest.raises(ValueError):
        fold("s", [Event(0, 1, 0.0, Created()), Event(2, 1, 0.0, Meta("x"))])
