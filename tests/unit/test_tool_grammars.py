"""The grammars that keep a model on the rails when it calls tools (issue 17, item 1), run by
llguidance over a byte-level vocabulary: an argument string cannot hold a raw newline, a
control character or the dialect's closing marker; enums, required keys and
additionalProperties: false hold; parallel_tool_calls false allows exactly one call; and
tool_choice auto is lazy: any text, and from the call-opening marker on, only calls."""

import llguidance
import pytest

from superfluid.codec import grammar as gr
from superfluid.codec.dialects import GENERIC, HERMES
from superfluid.codec.tools import tool_list

from .test_dialect_grammars import TOKENIZER, accepts

TOOLS = tool_list([
    {"type": "function", "function": {"name": "lookup_code", "parameters": {
        "type": "object", "properties": {"account": {"type": "string"},
                                         "kind": {"enum": ["pin", "password"]},
                                         "note": {"type": ["string", "null"]}},
        "required": ["account"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}])


def call(args: str, name: str = "lookup_code") -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


ONE = call('{"account": "acct-1234"}')


def forced(parallel: bool = False) -> str:
    return GENERIC.calls_grammar(TOOLS, None, parallel=parallel, lazy=False)


def lazy(parallel: bool = True) -> str:
    return GENERIC.calls_grammar(TOOLS, None, parallel=parallel, lazy=True)


def is_prefix(grammar: str, text: str) -> bool:
    """text can still become something the grammar accepts."""
    m = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    return m.consume_tokens(list(text.encode())) and not m.is_error()


@pytest.mark.parametrize("dialect", [GENERIC, HERMES])
def test_an_argument_string_cannot_hold_the_closing_marker(dialect):
    g = dialect.grammar(TOOLS, None)
    assert accepts(g, ONE)
    # the measured failure: the model "closes" the call from inside the account string
    assert not is_prefix(g, '<tool_call>\n{"name": "lookup_code", "arguments": {"account": "acct-1\\"})</tool_call>')
    assert not accepts(g, call('{"account": "acct-1</tool_call> To implement"}'))
    assert not accepts(g, call('{"account": "acct-1<\\/tool_call>"}'))  # nor escaped
    # a "<" or a piece of the marker is fine
    assert accepts(g, call('{"account": "a</tool_cal<b> </tool <<x"}'))


def test_an_argument_string_cannot_hold_a_raw_newline_or_control_character():
    g = forced()
    assert not accepts(g, call('{"account": "acct-\n1234"}'))
    assert not accepts(g, call('{"account": "acct-\t1234"}'))
    assert not accepts(g, call('{"account": "acct-\x011234"}'))
    assert accepts(g, call('{"account": "line one\\nline two"}'))  # an escaped newline is a value


def test_a_nullable_string_and_a_string_in_a_list_are_guarded_too():
    g = forced()
    assert accepts(g, call('{"account": "a", "note": null}'))
    assert not accepts(g, call('{"account": "a", "note": "x</tool_call>"}'))


def test_a_string_with_its_own_pattern_or_enum_is_left_as_the_schema_says():
    schema = gr.guarded({"type": "object", "properties": {
        "a": {"type": "string", "pattern": "^[a-z<>/_]+$"}, "b": {"type": "string", "enum": ["</tool_call>"]},
        "c": {"type": "array", "items": {"type": "string"}}}}, "</tool_call>")
    assert isinstance(schema, dict)
    props = schema["properties"]
    assert props["a"]["pattern"] == "^[a-z<>/_]+$" and "pattern" not in props["b"]
    assert props["c"]["items"]["pattern"] == gr.avoiding("</tool_call>")


def test_enums_required_keys_and_no_additional_properties_are_enforced():
    g = forced()
    assert accepts(g, call('{"account": "a", "kind": "pin"}'))
    assert not accepts(g, call('{"account": "a", "kind": "secret"}'))  # not in the enum
    assert not accepts(g, call('{"kind": "pin"}'))  # account is required
    assert not accepts(g, call('{"account": "a", "extra": 1}'))  # additionalProperties: false
    assert not accepts(g, call('{"tz": "UTC"}', "get_time")[:-1])  # unfinished
    assert accepts(g, call('{"tz": "UTC"}', "get_time"))


def test_parallel_tool_calls_false_allows_exactly_one_call():
    two = ONE + "\n" + call('{"tz": "UTC"}', "get_time")
    assert accepts(forced(parallel=True), ONE)
    assert accepts(forced(parallel=True), two)
    assert accepts(forced(parallel=True), two + "\n" + ONE)
    assert accepts(forced(parallel=False), ONE)
    assert not accepts(forced(parallel=False), two)
    assert not accepts(lazy(parallel=False), "Let me look.\n" + two)
    assert accepts(lazy(parallel=False), "Let me look.\n" + ONE)


def test_required_starts_inside_the_call_grammar():
    assert not accepts(forced(), "Sure. " + ONE)
    assert not accepts(forced(), "")


def test_the_lazy_grammar_accepts_prose_and_prose_then_calls():
    g = lazy()
    assert accepts(g, "")
    assert accepts(g, "The code is <b>secret</b>.\nA <tool_ call is not a call, nor is <tool_call")
    assert accepts(g, ONE)
    assert accepts(g, "Let me look that up.\n" + ONE)
    assert accepts(g, "Let me look that up.\n" + ONE + "\n" + call('{"tz": "UTC"}', "get_time"))


def test_the_lazy_grammar_enforces_the_call_once_the_marker_is_written():
    g = lazy()
    assert is_prefix(g, "ok <tool_call>")
    assert not is_prefix(g, "ok <tool_call>\nhello")  # not a call: refused
    assert not is_prefix(g, 'ok <tool_call>\n{"name": "nope"')  # not a tool
    assert not accepts(g, "ok " + call('{"account": "a", "kind": "secret"}'))
    assert not accepts(g, ONE + "\nAnd some text after it.")  # after the calls: the end
    assert not accepts(g, "ok <tool_call>\n" + '{"name": "lookup_code", "arguments": {"account": "a"}}')  # unclosed


def test_avoiding_rejects_exactly_the_strings_holding_the_marker():
    import re

    rx = re.compile(gr.avoiding("</x>").replace("\\x{", "\\x").replace("}", ""))  # Python's \xHH spelling
    for s, ok in [("", True), ("<", True), ("</x", True), ("<</x>", False), ("a</x>b", False), ("</x</x", True),
                  ("<<//x>", True), ("</xx>", True)]:
        assert bool(rx.match(s)) == ok, s
    with pytest.raises(ValueError):
        gr.avoiding("abca")  # its first character comes again
