"""Each dialect's call grammar (tool_choice "required" or a named function), run by llguidance
over a byte-level vocabulary: it accepts the dialect's own example call, rejects the call
with a wrong tool name or with arguments its schema forbids, and what it accepts is read back
by the dialect's own reader as the same call."""

import json

import llguidance
import pytest

from superfluid.codec.channels import Channels, ChannelSpec
from superfluid.codec.dialects import BY_NAME
from superfluid.codec.tools import tool_list
from superfluid.errors import BadRequest
from superfluid.request import Calls

TOOLS = tool_list([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}])

# the call each dialect's grammar must accept, as the model writes it after the opener
EXAMPLES = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "generic": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]',
    "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek_v3_1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
                     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "harmony": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
    "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "gemma": '```tool_code\nget_weather(city="Paris", days=3)\n```',
    "functionary": 'get_weather\n{"city": "Paris"}',
}
ARGS = {"qwen3_coder": {"city": "Paris", "days": 3}, "gemma": {"city": "Paris", "days": 3}}


class _Bytes:
    """A vocabulary of the 256 bytes and an end token: any text is a token sequence."""
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, s):
        return list(s.encode() if isinstance(s, str) else s)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def accepts(grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    return m.consume_tokens(list(text.encode())) and not m.is_error() and m.is_accepting()


def test_every_dialect_has_an_example():
    assert set(EXAMPLES) == set(BY_NAME)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_grammar_accepts_the_dialects_own_call(name):
    dialect, example = BY_NAME[name], EXAMPLES[name]
    assert accepts(dialect.grammar(TOOLS, None), example)
    assert accepts(dialect.grammar(TOOLS, "get_weather"), example)
    assert not accepts(dialect.grammar(TOOLS, "get_time"), example)  # a named function: only that one
    assert not accepts(dialect.grammar(TOOLS, None), example.replace("get_weather", "get_wether"))
    assert not accepts(dialect.grammar(TOOLS, None), example[:-1])  # unfinished


@pytest.mark.parametrize("name", sorted(n for n in EXAMPLES if n not in ("qwen3_coder",)))
def test_the_grammar_enforces_the_argument_schema(name):
    # "days" must be an integer: a string there is refused (Qwen3-Coder's values are text)
    bad = EXAMPLES[name].replace('"Paris"}', '"Paris", "days": "three"}').replace("days=3", 'days="three"')
    assert bad != EXAMPLES[name]
    assert not accepts(BY_NAME[name].grammar(TOOLS, None), bad)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_what_the_grammar_accepts_reads_back_as_the_call(name):
    text = EXAMPLES[name]
    ch = Channels(ChannelSpec(BY_NAME[name]))
    p, end = ch.feed(text), ch.finish()
    calls = Calls()
    calls.add(p.calls + end.calls)
    assert p.content + end.content == ""
    want = [("get_weather", ARGS.get(name, {"city": "Paris"}))]
    assert [(c.name, json.loads(c.arguments)) for c in calls.done] == want


def test_a_named_function_that_is_not_offered_is_a_typed_error():
    for dialect in BY_NAME.values():
        with pytest.raises(BadRequest) as e:
            dialect.grammar(TOOLS, "nope")
        assert e.value.param == "tool_choice", dialect.name
