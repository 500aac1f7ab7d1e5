"""Tool-call dialects against the real chat templates of each family (tests/fixtures/templates,
from llama.cpp): the dialect is detected from the template, a tool history renders through
the template in the dialect's own syntax, and each dialect's example output, streamed one
byte per token through the output processor and split in two at every character, gives the
same content, reasoning and calls."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from superfluid.codec.channels import THINK, Channels, ChannelSpec
from superfluid.codec.detok import TextStream
from superfluid.codec.dialects import BY_NAME, ORDER, by_name, detect
from superfluid.codec.output import OutputProcessor
from superfluid.codec.template import CHATML, ChatTemplate
from superfluid.codec.tools import tool_list
from superfluid.errors import BadRequest
from superfluid.request import Calls, FinishReason

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"

TOOLS = tool_list([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "the city"},
                                          "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                      "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                                     "required": ["tz"]}}}])

HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0a1b2c3d4e5f", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_0a1b2c3d4e5f", "content": "18 C and sunny"},
    {"role": "assistant", "content": "It is 18 C."},
    {"role": "user", "content": "And tomorrow?"},
]

# template fixture -> the dialect detected, and what its rendering of HISTORY must contain
RENDERED = {
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                           "</tool_call>"),
    "Qwen-Qwen3-0.6B": ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                  "</tool_call>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": '
                                                              '{"city": "Paris"}}\n</tool_call>'),
    "Qwen3-Coder": ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                                   "</function>\n</tool_call>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": '
                                                        '{"city": "Paris"}, "id": "'),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
                                                             "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}"
                                                             "\n```<｜tool▁call▁end｜>"),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek_v3_1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
                                                   '<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
                                                   "<｜tool▁calls▁end｜>"),
    "openai-gpt-oss-120b": ("harmony", '<|start|>assistant to=functions.get_weather<|channel|>commentary json'
                                       '<|message|>{"city": "Paris"}<|call|>'),
    "ibm-granite-granite-3.3-2B-Instruct": ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": '
                                                       '{"city": "Paris"}}]'),
    "google-gemma-2-2b-it": ("gemma", '```tool_code\nget_weather(city="Paris")\n```'),
    "meetkai-functionary-medium-v3.2": ("functionary", '>>>get_weather\n{"city": "Paris"}'),
}


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def test_every_fixture_is_covered_and_detected():
    assert {p.stem for p in TEMPLATES.glob("*.jinja")} == set(RENDERED)
    for name, (dialect, _) in RENDERED.items():
        assert detect(template(name)).name == dialect, name
    assert detect(CHATML).name == "generic"  # SmolLM2's: no tool support
    assert {d.name for d in ORDER} == set(BY_NAME) and len(BY_NAME) == 11


def test_an_unknown_dialect_name_is_a_typed_error_listing_the_names():
    with pytest.raises(BadRequest) as e:
        by_name("klingon")
    assert e.value.param == "tool_dialect" and "hermes" in e.value.message and "harmony" in e.value.message


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_a_tool_history_renders_through_the_real_template(name):
    dialect_name, call = RENDERED[name]
    dialect = BY_NAME[dialect_name]
    messages, extra = dialect.render(HISTORY, TOOLS)
    text = ChatTemplate(template(name), bos="<s>", eos="</s>").render(messages, **extra)
    assert call in text  # the past call, in the dialect's own syntax
    assert "18 C and sunny" in text and "It is 18 C." in text and text.count("And tomorrow?") == 1
    assert "Time in a zone" in text  # the tools are listed (by the template or by our note)
    assert "You are terse." in text


def test_llama3_built_in_tools_render_through_the_real_template():
    from .test_dialect_calls import BUILTINS

    history = [HISTORY[1], {**HISTORY[2], "tool_calls": [
        {"id": "call_0a1b2c3d4e5f", "type": "function",
         "function": {"name": "brave_search", "arguments": '{"query": "weather in Paris"}'}}]}, *HISTORY[3:]]
    messages, extra = BY_NAME["llama3"].render(history, TOOLS + BUILTINS)
    assert extra["builtin_tools"] == ["brave_search", "wolfram_alpha", "code_interpreter"]
    text = ChatTemplate(template("meta-llama-Llama-3.1-8B-Instruct"), bos="<s>").render(messages, **extra)
    # the interpreter is the ipython environment itself, the others are named
    assert "Environment: ipython\nTools: brave_search, wolfram_alpha\n" in text
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n<|python_tag|>brave_search.call(query="weather in '
            'Paris")<|eom_id|>') in text
    # the result is an ipython turn, its text through the template's own tojson
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"18 C and sunny"<|eot_id|>' in text
    assert "Time in a zone" in text  # the functions are still listed
    assert "builtin_tools" not in BY_NAME["llama3"].render(HISTORY, TOOLS)[1]


def test_gemma_turns_alternate_and_tool_results_are_user_turns():
    messages, _ = BY_NAME["gemma"].render(HISTORY, TOOLS)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("You are terse.") and "```tool_code" in messages[0]["content"]
    assert messages[2]["content"] == "```tool_output\n18 C and sunny\n```"


def test_mistral_maps_call_ids_onto_nine_characters_the_same_for_call_and_result():
    messages, _ = BY_NAME["mistral"].render(HISTORY, TOOLS)
    cid = messages[2]["tool_calls"][0]["id"]
    assert len(cid) == 9 and cid.isalnum() and messages[3]["tool_call_id"] == cid


@dataclass
class Case:
    dialect: str
    output: str  # what the model writes (special tokens as their names)
    content: str = ""
    reasoning: str = ""
    calls: list = field(default_factory=list)
    think: bool = False  # the template's <think> markers split the reasoning
    start_in: bool = False  # the opener already opened the reasoning


CASES = {
    "hermes": Case("hermes", '<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{"name": '
                   '"get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
                   '"arguments": {"tz": "CET"}}\n</tool_call>', "Let me check.\n", "\nThe user wants weather.\n",
                   [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})], think=True),
    "generic": Case("generic", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Köln"}}\n'
                    "</tool_call>",
                    "Sure.\n", calls=[("get_weather", {"city": "Köln"})]),
    "qwen3_coder": Case("qwen3_coder", "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n"
                        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "Checking.\n",
                        calls=[("get_weather", {"city": "São Paulo", "days": 3})]),
    "llama3": Case("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                   calls=[("get_weather", {"city": "Paris"})]),
    "llama3_python_tag": Case("llama3", '<|python_tag|>{"name": "get_time", "parameters": {"tz": "CET"}}',
                              calls=[("get_time", {"tz": "CET"})]),
    "llama3_builtin": Case("llama3", '<|python_tag|>brave_search.call(query="weather in Paris")',
                           calls=[("brave_search", {"query": "weather in Paris"})]),
    "llama3_code": Case("llama3", "Let me compute. <|python_tag|>import math\nprint(math.sqrt(2))", "Let me compute. ",
                        calls=[("code_interpreter", {"code": "import math\nprint(math.sqrt(2))"})]),
    "mistral": Case("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
                    '"id": "a1b2c3d4e"}, {"name": "get_time", "arguments": {"tz": "CET"}}]',
                    calls=[("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    "deepseek": Case("deepseek", "Need the weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
                     "<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n"
                     "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"CET\"}\n```"
                     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", "Need the weather.\n",
                     [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})], think=True, start_in=True),
    "deepseek_v3_1": Case("deepseek_v3_1", "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                          '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "Sure.",
                          calls=[("get_weather", {"city": "Paris"})], think=True),
    "harmony": Case("harmony", "<|channel|>analysis<|message|>User wants the weather.<|end|><|start|>assistant"
                    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
                    reasoning="User wants the weather.", calls=[("get_weather", {"city": "Paris"})]),
    "harmony_recipient_first": Case("harmony", " to=functions.get_time<|channel|>commentary json<|message|>"
                                    '{"tz": "CET"}', calls=[("get_time", {"tz": "CET"})]),
    "harmony_final": Case("harmony", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
                          "<|message|>It is 18 C.", "It is 18 C.", "Easy."),
    "granite": Case("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
                    calls=[("get_weather", {"city": "Paris"})], think=True),
    "granite_thinking": Case("granite", "<think>Weather is known.</think><response>It is 18 C.</response>",
                             "It is 18 C.", "Weather is known.", think=True),
    "gemma": Case("gemma", 'Let me look.\n```tool_code\nget_weather(city="Paris", days=3)\n```', "Let me look.\n",
                  calls=[("get_weather", {"city": "Paris", "days": 3})]),
    "functionary": Case("functionary", 'all\nLet me check.>>>get_weather\n{"city": "Paris"}', "Let me check.",
                        calls=[("get_weather", {"city": "Paris"})]),
    "functionary_text": Case("functionary", "all\nIt is 18 C.", "It is 18 C."),
}


def _spec(case: Case) -> ChannelSpec:
    return ChannelSpec(BY_NAME[case.dialect], THINK if case.think else None, case.start_in)


def _calls(calls) -> list:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("key", sorted(CASES))
def test_output_streamed_one_byte_per_token(key):
    case = CASES[key]
    data = case.output.encode()
    eos = 256
    out = OutputProcessor(TextStream([bytes([b]) for b in range(256)] + [b""], frozenset({eos})), _spec(case))
    content, reasoning, calls = "", "", Calls()
    for i, t in enumerate([*data, eos]):
        o = out.token(t, FinishReason.END_OF_TURN if i == len(data) else None)
        content, reasoning = content + o.text, reasoning + o.reasoning
        calls.add(o.calls)
    assert (content, reasoning, _calls(calls.done)) == (case.content, case.reasoning, case.calls)
    assert len({c.id for c in calls.done}) == len(case.calls)


@pytest.mark.parametrize("key", sorted(CASES))
def test_output_split_in_two_at_every_character(key):
    case = CASES[key]
    for i in range(len(case.output) + 1):
        ch = Channels(_spec(case))
        content, reasoning, calls = "", "", Calls()
        for piece in (case.output[:i], case.output[i:]):
            p = ch.feed(piece)
            content, reasoning = content + p.content, reasoning + p.reasoning
            calls.add(p.calls)
        p = ch.finish()
        calls.add(p.calls)
        got = (content + p.content, reasoning + p.reasoning, _calls(calls.done))
        assert got == (case.content, case.reasoning, case.calls), f"split at {i}"


@pytest.mark.parametrize("dialect,text", [
    ("qwen3_coder", "<tool_call>\nnot xml</tool_call> ok"),
    ("deepseek_v3_1", "<｜tool▁calls▁begin｜>nothing<｜tool▁calls▁end｜> ok"),
    ("gemma", "```tool_code\nimport os\n``` ok"),
    ("mistral", "[TOOL_CALLS] not json ok"),
    ("granite", "<|tool_call|>oops ok"),
])
def test_a_block_that_is_no_call_comes_back_as_text(dialect, text):
    ch = Channels(ChannelSpec(BY_NAME[dialect]))
    p = ch.feed(text)
    end = ch.finish()
    assert p.content + end.content == text and not p.calls and not end.calls


def test_a_call_cut_off_by_the_end_of_the_reply_is_never_text():
    ch = Channels(ChannelSpec(BY_NAME["qwen3_coder"]))
    p = ch.feed("Hi <tool_call>\n<function=get_weather>\n<parameter=ci")
    end = ch.finish()
    assert p.content + end.content == "Hi " and not end.calls and ch.cut_call


def test_plain_text_with_a_harmony_or_functionary_template_is_content():
    for name in ("harmony", "functionary"):
        ch = Channels(ChannelSpec(BY_NAME[name]))
        p = ch.feed("Hello there, friend.")
        assert p.content + ch.finish().content == "Hello there, friend.", name


class _Vocab:
    """Bytes, then two control tokens that detokenize to nothing (as llama.cpp's do)."""
    SPECIAL = {"[TOOL_CALLS]": 256, "</s>": 257}

    def __init__(self, template: str):
        self.pieces = [bytes([b]) for b in range(256)] + [b"", b""]
        self.chat_template, self.bos, self.eos = template, -1, 257

    def token_text(self, t: int) -> bytes:
        return self.pieces[t] or next(k for k, v in self.SPECIAL.items() if v == t).encode()

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        if parse_special and text in self.SPECIAL:
            return [self.SPECIAL[text]]
        return list(text.encode())


def test_the_codec_names_the_dialects_control_tokens_in_replies():
    from superfluid.codec.model import Codec
    codec = Codec.of(_Vocab(template("mistralai-Mistral-Nemo-Instruct-2407")))  # type: ignore[arg-type]
    assert codec.tool_format.name == "mistral"
    assert codec.pieces[256] == b"[TOOL_CALLS]" and codec.pieces[257] == b""  # only the dialect's markers
    assert codec.pieces[:256] == [bytes([b]) for b in range(256)]
    plain = Codec.of(_Vocab(CHATML))  # type: ignore[arg-type]
    assert plain.tool_format.name == "generic" and plain.pieces[256] == b""


def test_a_named_dialect_overrides_the_detected_one():
    from superfluid.codec.model import Codec
    codec = Codec.of(_Vocab(template("Qwen-Qwen3-0.6B")), tool_dialect="qwen3_coder")  # type: ignore[arg-type]
    assert codec.tool_format.name == "qwen3_coder" and codec.reasoning == THINK
    harmony = Codec.of(_Vocab(template("openai-gpt-oss-120b")))  # type: ignore[arg-type]
    assert harmony.tool_format.name == "harmony" and harmony.reasoning is None  # its reader splits the analysis
    with pytest.raises(BadRequest):
        Codec.of(_Vocab(CHATML), tool_dialect="klingon")  # type: ignore[arg-type]
