"""Every dialect's lazy and parallel call grammars (issue 17, item 1), run by llguidance over a
byte-level vocabulary: tool_choice "auto" accepts free text followed by the dialect's own call
and refuses a malformed call once the call-opening marker is written; parallel_tool_calls
false allows exactly one call and true more than one; an argument string cannot hold the
marker that would end the call; and what the grammars accept reads back as those calls."""

import json
import re

import pytest

from superfluid.codec import grammar as gr
from superfluid.codec.channels import Channels, ChannelSpec
from superfluid.codec.dialects import BY_NAME
from superfluid.codec.tools import tool_list
from superfluid.request import Calls

from .test_dialect_grammars import EXAMPLES, TOOLS, accepts
from .test_tool_grammars import is_prefix

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
C, CE, S = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
HERMES_TIME = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'

# each dialect's own call (test_dialect_grammars.EXAMPLES) and a second one after it, as the
# model's template writes several calls
TWO = {
    "hermes": EXAMPLES["hermes"] + "\n" + HERMES_TIME,
    "generic": EXAMPLES["generic"] + "\n" + HERMES_TIME,
    "qwen3_coder": EXAMPLES["qwen3_coder"] + "\n<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n"
                                             "</parameter>\n</function>\n</tool_call>",
    "llama3": EXAMPLES["llama3"] + '; {"name": "get_time", "parameters": {"tz": "UTC"}}',
    "mistral": EXAMPLES["mistral"][:-1] + ', {"name": "get_time", "arguments": {"tz": "UTC"}}]',
    "deepseek": EXAMPLES["deepseek"].removesuffix(E) + f'\n{C}function{S}get_time\n```json\n{{"tz": "UTC"}}\n```'
                                                      f"{CE}{E}",
    "deepseek_v3_1": EXAMPLES["deepseek_v3_1"].removesuffix(E) + f'{C}get_time{S}{{"tz": "UTC"}}{CE}{E}',
    "granite": EXAMPLES["granite"][:-1] + ', {"name": "get_time", "arguments": {"tz": "UTC"}}]',
    "gemma": EXAMPLES["gemma"].removesuffix("\n```") + '\nget_time(tz="UTC")\n```',
    "functionary": EXAMPLES["functionary"] + '>>>get_time\n{"tz": "UTC"}',
}
# the free text a lazy grammar allows before the call, ending where the call starts
LEAD = {name: "Let me check.\n" for name in TWO}
LEAD["llama3"] = "Let me check. <|python_tag|>"
LEAD["functionary"] = "all\nLet me check.\n>>>"
# free text, the call-opening marker, and then something that is not a call
BAD = {name: "Let me check.\n" + opening + "hello" for name, opening in [
    ("hermes", "<tool_call>\n"), ("generic", "<tool_call>\n"), ("qwen3_coder", "<tool_call>\n"),
    ("llama3", "<|python_tag|>"), ("mistral", "[TOOL_CALLS]["), ("deepseek", B + C), ("deepseek_v3_1", B + C),
    ("granite", "<|tool_call|>["), ("gemma", "```tool_code\n")]}
BAD["functionary"] = "all\nLet me check.\n>>>hello\n{}"
LAZY = sorted(TWO)


def grammar(name: str, *, parallel: bool, lazy: bool) -> str:
    return BY_NAME[name].calls_grammar(TOOLS, None, parallel=parallel, lazy=lazy)


def read(name: str, text: str) -> tuple[str, list[tuple[str, dict]]]:
    ch = Channels(ChannelSpec(BY_NAME[name]))
    p, end = ch.feed(text), ch.finish()
    calls = Calls()
    calls.add(p.calls + end.calls)
    return p.content + end.content, [(c.name, json.loads(c.arguments)) for c in calls.done]


def test_every_dialect_is_covered():
    assert set(TWO) | {"harmony"} == set(BY_NAME)


@pytest.mark.parametrize("name", LAZY)
def test_the_lazy_grammar_accepts_text_then_the_dialects_own_call(name):
    for parallel in (False, True):
        g = grammar(name, parallel=parallel, lazy=True)
        assert accepts(g, "") or name == "functionary", name  # Functionary's reply names a recipient
        assert accepts(g, "all\nThe weather is fine." if name == "functionary" else "The weather is fine."), name
        assert accepts(g, LEAD[name] + EXAMPLES[name]), name
    assert accepts(grammar(name, parallel=True, lazy=True), LEAD[name] + TWO[name])
    assert not accepts(grammar(name, parallel=False, lazy=True), LEAD[name] + TWO[name])


@pytest.mark.parametrize("name", LAZY)
def test_the_lazy_grammar_refuses_a_malformed_call_after_the_marker(name):
    g = grammar(name, parallel=True, lazy=True)
    assert not is_prefix(g, BAD[name]), name
    assert not accepts(g, LEAD[name] + EXAMPLES[name].replace("get_weather", "get_wether")), name
    assert not accepts(g, LEAD[name] + EXAMPLES[name][:-1]), name  # unfinished


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_without_parallel_calls_exactly_one_call(name):
    g = grammar(name, parallel=False, lazy=False)
    assert accepts(g, EXAMPLES[name])
    assert not accepts(g, TWO.get(name, EXAMPLES[name] + "<|call|>" + EXAMPLES[name]))


@pytest.mark.parametrize("name", LAZY)
def test_with_parallel_calls_one_call_or_more(name):
    g = grammar(name, parallel=True, lazy=False)
    assert accepts(g, EXAMPLES[name]) and accepts(g, TWO[name])
    assert not accepts(g, "Sure. " + EXAMPLES[name])  # forced: calls from the first token


HARMONY_NEXT = "<|end|><|start|>assistant"
HARMONY_THINK = "<|channel|>analysis<|message|>The user wants the weather." + HARMONY_NEXT


def test_harmony_auto_is_free_until_a_call_is_opened_and_one_call_per_turn():
    # markers as text (--tool-dialect harmony on another family's model; test_special_markers
    # has gpt-oss's special tokens): free text up to <|start|>assistant<|channel|>commentary
    # to=functions., or a call from the first token
    for parallel in (False, True):
        g = grammar("harmony", parallel=parallel, lazy=True)
        assert accepts(g, "The weather is fine.") and accepts(g, HARMONY_THINK + "<|channel|>final<|message|>Fine.")
        assert accepts(g, HARMONY_THINK + EXAMPLES["harmony"]) and accepts(g, EXAMPLES["harmony"])
        assert not is_prefix(g, HARMONY_THINK + "<|channel|>commentary to=functions.get_weather <|constrain|>"
                                                "json<|message|>hello")
        assert not accepts(g, HARMONY_THINK + EXAMPLES["harmony"].replace("get_weather", "get_wether"))
        assert not accepts(g, HARMONY_THINK + EXAMPLES["harmony"] + "<|call|><|start|>assistant" +
                           EXAMPLES["harmony"])  # <|call|> ends the turn: one call
    two = EXAMPLES["harmony"] + "<|call|><|start|>assistant" + EXAMPLES["harmony"]
    assert not accepts(grammar("harmony", parallel=True, lazy=False), two)
    ch = Channels(ChannelSpec(BY_NAME["harmony"]))
    p, end = ch.feed(HARMONY_THINK + EXAMPLES["harmony"]), ch.finish()
    assert (p.content, p.reasoning) == ("", "The user wants the weather.")
    assert [(c.name, json.loads(c.arguments)) for c in end.calls] == [("get_weather", {"city": "Paris"})]


def test_llama3_a_reply_that_starts_with_a_brace_is_a_call():
    g = grammar("llama3", parallel=False, lazy=True)
    assert accepts(g, EXAMPLES["llama3"])
    assert not is_prefix(g, '{"answer": 42}')
    assert accepts(g, "The answer is {42}.")


# Llama 3.1's built-in tools, offered as functions under their names
BUILTINS = tool_list([
    {"type": "function", "function": {"name": "brave_search", "description": "Search the web", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "wolfram_alpha", "description": "Ask Wolfram Alpha"}},
    {"type": "function", "function": {"name": "code_interpreter", "description": "Run Python"}}])
SEARCH = '<|python_tag|>brave_search.call(query="weather in Paris")'
CODE = "<|python_tag|>import math\nprint(math.sqrt(2))"


def test_llama3_built_in_tools_are_called_after_the_python_tag():
    for lazy in (False, True):
        for parallel in (False, True):
            g = BY_NAME["llama3"].calls_grammar(TOOLS + BUILTINS, None, parallel=parallel, lazy=lazy)
            assert accepts(g, SEARCH) and accepts(g, '<|python_tag|>wolfram_alpha.call(query="2+2")')
            assert accepts(g, CODE) and accepts(g, '<|python_tag|>code_interpreter.call(code="print(1)")')
            assert accepts(g, EXAMPLES["llama3"]) and accepts(g, "<|python_tag|>" + EXAMPLES["llama3"])
        g = BY_NAME["llama3"].calls_grammar(TOOLS + BUILTINS[:1], None, parallel=True, lazy=lazy)
        assert accepts(g, SEARCH) and not accepts(g, SEARCH + "; " + EXAMPLES["llama3"])  # a built-in call is alone
        assert not is_prefix(g, "<|python_tag|>import")  # no code interpreter offered: no code
        assert not is_prefix(g, '<|python_tag|>wolfram_alpha.call(')  # not offered
        assert not is_prefix(g, "<|python_tag|>brave_search.call(query=3")  # its argument is a string
        assert not accepts(BY_NAME["llama3"].calls_grammar(TOOLS, None, parallel=False, lazy=lazy), SEARCH)
    assert accepts(BY_NAME["llama3"].calls_grammar(TOOLS + BUILTINS, None, parallel=False, lazy=True),
                   "Let me search. " + SEARCH)
    named = BY_NAME["llama3"].grammar(TOOLS + BUILTINS, "brave_search")
    assert accepts(named, SEARCH) and not accepts(named, CODE) and not accepts(named, EXAMPLES["llama3"])
    assert not accepts(BY_NAME["llama3"].grammar(TOOLS + BUILTINS, "get_weather"), SEARCH)
    assert not accepts(BY_NAME["llama3"].grammar(TOOLS + BUILTINS, None), "Sure. " + SEARCH)  # forced
    # and they read back as calls to the built-in tools
    assert read("llama3", SEARCH) == ("", [("brave_search", {"query": "weather in Paris"})])
    assert read("llama3", CODE) == ("", [("code_interpreter", {"code": "import math\nprint(math.sqrt(2))"})])


@pytest.mark.parametrize("name", LAZY)
def test_what_the_grammars_accept_reads_back_as_the_calls(name):
    weather = ("get_weather", {"city": "Paris", "days": 3} if name in ("qwen3_coder", "gemma") else {"city": "Paris"})
    content, calls = read(name, TWO[name])
    assert content == "" and calls == [weather, ("get_time", {"tz": "UTC"})], name
    content, calls = read(name, LEAD[name] + EXAMPLES[name])
    assert content.strip() == "Let me check." and calls == [weather], name


@pytest.mark.parametrize("name, marker", [
    ("deepseek", CE), ("deepseek", E), ("deepseek_v3_1", CE), ("functionary", ">>>"), ("harmony", "<|call|>"),
    ("hermes", "</tool_call>")])
def test_an_argument_string_cannot_hold_the_marker_that_ends_the_call(name, marker):
    g = grammar(name, parallel=False, lazy=False)
    assert accepts(g, EXAMPLES[name].replace('"Paris"', '"Pa<ri>s"'))
    assert not accepts(g, EXAMPLES[name].replace('"Paris"', f'"Pa{marker}ris"'))


def test_avoiding_a_run_of_one_character():
    rx = re.compile(re.sub(r"\\x\{([0-9a-f]+)\}", r"\\x\1", gr.avoiding(">>>")))
    for s, ok in [("", True), (">", True), (">>", True), ("a>>b>>", True), ("> > >", True), (">>>", False),
                  ("a>>>", False), (">>>>b", False), (">>a>>>", False)]:
        assert bool(rx.match(s)) == ok, s
