"""Forced tool calls on thinking models (issue 17): with tool_choice "required" or a named
function, a model that reasons first writes its reasoning block and then must call: `<think>`
(Qwen 3, DeepSeek R1 and V3.1, Granite 3.3) or Harmony's analysis message. The block is
optional where the template leaves it to the model, required (without its open marker)
where the assistant opener already opened it, and absent where the request turned reasoning
off or the opener closed it. The grammars run by llguidance over a byte-level vocabulary, and
what they accept reads back as the reasoning and the call."""

import json
from types import SimpleNamespace

import pytest

from superfluid.api.prompt import forced_thinking
from superfluid.codec import grammar as gr
from superfluid.codec.channels import THINK, Channels, ChannelSpec, reasoning_markers, spec_for
from superfluid.codec.dialects import BY_NAME, HARMONY, by_name
from superfluid.codec.template import CHATML, ChatTemplate
from superfluid.request import Calls

from .test_dialect_calls import TWO
from .test_dialect_grammars import EXAMPLES, TOOLS, accepts
from .test_dialects import template

ASK = [{"role": "user", "content": "Weather in Paris?"}]
ANALYSIS = "<|channel|>analysis<|message|>"
NEXT = "<|end|><|start|>assistant"
THINKING = gr.Thinking(*THINK)
INSIDE = gr.Thinking(*THINK, inside=True)


def opener_and_block(source: str, dialect: str | None = None, **kwargs) -> tuple[str, gr.Thinking | None]:
    """What the assistant opener of the template is for ASK with TOOLS, and the block a forced
    call may follow there (as api/prompt.py decides it)."""
    d = by_name(dialect) if dialect else next(x for x in BY_NAME.values() if x.detect(source))
    msgs, extra = d.render(ASK, TOOLS)
    t = ChatTemplate(source, bos="<s>", eos="</s>")
    full = t.render(msgs, add_generation_prompt=True, **extra, **kwargs)
    opener = full[len(t.render(msgs, add_generation_prompt=False, **extra, **kwargs)):]
    channels = spec_for(d, None if d.own_reasoning else reasoning_markers(source), opener)
    engine = SimpleNamespace(tool_format=d, template=t)
    return opener, forced_thinking(engine, channels, kwargs, opener)


@pytest.mark.parametrize("name, kwargs, want", [
    ("Qwen-Qwen3-0.6B", {}, THINKING),  # the model may think first
    ("Qwen-Qwen3-0.6B", {"enable_thinking": False}, None),  # the opener wrote an empty block
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", {}, INSIDE),  # the opener opened <think>
    ("deepseek-ai-DeepSeek-V3.1", {}, None),  # thinking off by default: "<think></think>"
    ("deepseek-ai-DeepSeek-V3.1", {"thinking": True}, INSIDE),
    ("ibm-granite-granite-3.3-2B-Instruct", {"thinking": True}, THINKING),
    ("ibm-granite-granite-3.3-2B-Instruct", {"thinking": False}, None),
    ("openai-gpt-oss-120b", {}, HARMONY.reasoning_block),  # the analysis message
    ("openai-gpt-oss-120b", {"reasoning_effort": "low"}, HARMONY.reasoning_block),
    ("Qwen-Qwen2.5-7B-Instruct", {}, None),  # no reasoning at all
])
def test_which_reasoning_block_a_forced_call_may_follow(name, kwargs, want):
    opener, block = opener_and_block(template(name), **kwargs)
    assert block == want, (name, opener)


def test_a_dialect_put_on_another_familys_template_brings_no_reasoning():
    # --tool-dialect harmony on a ChatML model: its template has no analysis channel
    assert opener_and_block(CHATML, "harmony")[1] is None
    assert opener_and_block(template("openai-gpt-oss-120b"), "harmony")[1] is not None


# family -> (dialect, block, the reply's reasoning block as the model writes it, the reasoning read)
FAMILIES = {
    "qwen3": ("hermes", THINKING, "<think>\nThe user wants the weather.\n</think>\n\n",
              "\nThe user wants the weather.\n"),
    "deepseek_r1": ("deepseek", INSIDE, "The user wants the weather.\n</think>\n\n", "The user wants the weather.\n"),
    "deepseek_v3_1": ("deepseek_v3_1", INSIDE, "The user wants the weather.</think>", "The user wants the weather."),
    "granite": ("granite", THINKING, "<think>The user wants the weather.</think>", "The user wants the weather."),
    "harmony": ("harmony", HARMONY.reasoning_block, ANALYSIS + "The user wants the weather." + NEXT,
                "The user wants the weather."),
}


def forced(dialect: str, block: gr.Thinking | None, name: str | None = None, parallel: bool = False) -> str:
    return BY_NAME[dialect].calls_grammar(TOOLS, name, parallel=parallel, lazy=False, lits=gr.PLAIN.thinking(block))


def read(dialect: str, block: gr.Thinking, text: str) -> tuple[str, str, list]:
    spec = ChannelSpec(BY_NAME[dialect], None if BY_NAME[dialect].own_reasoning else THINK, block.inside)
    ch = Channels(spec)
    p, end = ch.feed(text), ch.finish()
    calls = Calls()
    calls.add(p.calls + end.calls)
    return p.content + end.content, p.reasoning + end.reasoning, [(c.name, json.loads(c.arguments))
                                                                  for c in calls.done]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_forced_call_may_follow_the_reasoning(family):
    dialect, block, thought, _ = FAMILIES[family]
    call = EXAMPLES[dialect]
    g = forced(dialect, block)
    assert accepts(g, thought + call)
    assert accepts(forced(dialect, block, "get_weather"), thought + call)
    assert not accepts(forced(dialect, block, "get_time"), thought + call)  # a named function: only that one
    assert accepts(g, call) != block.inside  # optional, unless the opener opened the block
    assert not accepts(g, thought + "It is sunny.")  # after the reasoning: the call
    assert not accepts(g, "Sure. " + call) and not accepts(g, thought + "Sure. " + call)
    assert not accepts(g, thought[:-len(block.close) - 2] + call)  # reasoning that never closes holds no call
    if dialect in TWO:
        assert accepts(forced(dialect, block, parallel=True), thought + TWO[dialect])
        assert not accepts(g, thought + TWO[dialect])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_reader_splits_the_reasoning_from_the_call(family):
    dialect, block, thought, reasoning = FAMILIES[family]
    assert read(dialect, block, thought + EXAMPLES[dialect]) == ("", reasoning, [("get_weather", {"city": "Paris"})])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_without_a_block_the_call_comes_first(family):
    # reasoning turned off (or a model that does not reason): the dialect's own forced grammar
    dialect, _, thought, _ = FAMILIES[family]
    g = forced(dialect, None)
    assert g == BY_NAME[dialect].grammar(TOOLS, None)
    assert accepts(g, EXAMPLES[dialect]) and not accepts(g, thought + EXAMPLES[dialect])


def test_the_reasoning_ends_at_its_first_close_marker():
    g = forced("hermes", THINKING)
    call = EXAMPLES["hermes"]
    assert accepts(g, "<think>a <b> </thin <tool_call> c</think>" + call)  # markup inside the reasoning is text
    assert not accepts(g, "<think>a</think> b</think>" + call)


def test_a_requests_forced_grammar_lets_a_thinking_model_reason_first():
    # the request path (api/prompt.py) on a model whose template has <think> markers
    from superfluid.api.prompt import chat_prompt

    from ..fakes import FakeModel

    eng = FakeModel().engine()
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

    def grammar(**kw) -> str:
        return chat_prompt(eng, ASK, tools=TOOLS, **kw).grammar

    assert accepts(grammar(tool_choice="required"), "<think>Weather.</think>\n" + call)
    assert accepts(grammar(tool_choice={"type": "function", "function": {"name": "get_weather"}}),
                   "<think>Weather.</think>\n" + call)
    off = grammar(tool_choice="required", template_kwargs={"enable_thinking": False})
    assert accepts(off, call) and not accepts(off, "<think>Weather.</think>\n" + call)
