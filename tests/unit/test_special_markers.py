"""Tool-call grammars on a vocabulary whose markers are single special tokens (Qwen's
<tool_call>, Llama 3's <|python_tag|>, Mistral's [TOOL_CALLS], DeepSeek's and Harmony's
markers, <think>): llguidance never matches a special token against quoted text, and a lazy
grammar's free text cannot hold one, so a grammar must name such a marker as the token, or
the model is made to spell it byte by byte. Run with the runtime's own grammar tokenizer
(llguidance.llamacpp over the vocab) on a real GGUF vocabulary (special_vocab.py); where
the markers are text (the embedded model), the grammars are the same as with no special tokens."""

import json

import llguidance
import pytest
from llguidance import LLMatcher

from superfluid.codec import grammar as gr
from superfluid.codec.channels import THINK, Channels, ChannelSpec
from superfluid.codec.dialects import BY_NAME
from superfluid.codec.hf_tokenizer import HfTokenizer
from superfluid.codec.model import marker_pieces
from superfluid.codec.tokenizer import Tokenizer
from superfluid.runtime.gguf_vocab import GgufVocab
from superfluid.runtime.registry import embedded_model

from .special_vocab import MARKERS, special_gguf
from .test_dialect_calls import BAD, LAZY, LEAD, TWO, read
from .test_dialect_grammars import ARGS, EXAMPLES, TOOLS

FORCED = sorted(EXAMPLES)


@pytest.fixture(scope="module")
def vocab():
    path = special_gguf()
    return Tokenizer(path), GgufVocab(path).grammar_tokenizer()


def toks(tk: Tokenizer, text: str) -> list[int]:
    """text as the model writes it: each marker its special token"""
    return tk.encode(text, parse_special=True)


def spell(tk: Tokenizer, text: str) -> list[int]:
    """text a character a token: no marker is its token"""
    return [t for ch in text for t in tk.encode(ch)]


def lits(tk: Tokenizer, name: str, reasoning: tuple[str, ...] = ()) -> gr.Literals:
    return gr.Literals.of(tk, BY_NAME[name].markers, reasoning)


def accepts(lt, grammar: str, ids: list[int]) -> bool:
    m = LLMatcher(lt, grammar, log_level=0)
    return m.consume_tokens(ids) and not m.is_error() and m.is_accepting()


def allows(lt, grammar: str, ids: list[int], token: int) -> bool:
    """the grammar lets `token` follow `ids`"""
    m = LLMatcher(lt, grammar, log_level=0)
    assert m.consume_tokens(ids), m.get_error()
    return bool(m.compute_bitmask()[token // 8] >> (token % 8) & 1)


def test_special_id_is_llguidances_own_rule(vocab):
    tk, lt = vocab
    for marker in MARKERS:
        (t,) = tk.encode(marker, parse_special=True)
        assert (tk.special_id(marker) == t) == lt.is_special_token(t), marker
        assert (tk.special_id(marker) is None) == (marker == "[NOT_SPECIAL]"), marker
    assert tk.special_id("<tool_call>\n") is None  # several tokens
    assert tk.special_id("hello") is None and tk.special_id("") is None


def test_the_lazy_hermes_grammar_lets_the_special_token_through_then_holds_the_call(vocab):
    tk, lt = vocab
    tc = tk.special_id("<tool_call>")
    lead = toks(tk, "Let me check.\n")
    for parallel in (False, True):
        g = BY_NAME["hermes"].calls_grammar(TOOLS, None, parallel=parallel, lazy=True, lits=lits(tk, "hermes"))
        assert f"<[{tc}]>" in g
        assert allows(lt, g, [], tc) and allows(lt, g, lead, tc)  # the model's own token opens a call
        assert accepts(lt, g, toks(tk, "The weather is fine.")) and accepts(lt, g, [])
        assert accepts(lt, g, lead + toks(tk, EXAMPLES["hermes"]))
        assert accepts(lt, g, toks(tk, EXAMPLES["hermes"]))  # a call from the first token
        assert not accepts(lt, g, lead + toks(tk, "<tool_call>\nhello"))  # then only a call
        assert not accepts(lt, g, lead + toks(tk, EXAMPLES["hermes"].replace("get_weather", "get_wether")))
        assert not allows(lt, g, lead + toks(tk, EXAMPLES["hermes"]) + toks(tk, "\n"), tk.encode("A")[0])
    # what the plain grammar did on such a vocabulary: the model could not write its marker
    plain = BY_NAME["hermes"].calls_grammar(TOOLS, None, parallel=False, lazy=True)
    assert not allows(lt, plain, lead, tc)


@pytest.mark.parametrize("name", LAZY)
def test_every_lazy_grammar_takes_the_markers_as_tokens(vocab, name):
    tk, lt = vocab
    lead = LEAD[name]
    for parallel in (False, True):
        g = BY_NAME[name].calls_grammar(TOOLS, None, parallel=parallel, lazy=True, lits=lits(tk, name))
        assert accepts(lt, g, toks(tk, lead + EXAMPLES[name])), name
        assert not accepts(lt, g, toks(tk, BAD[name])), name
    g = BY_NAME[name].calls_grammar(TOOLS, None, parallel=True, lazy=True, lits=lits(tk, name))
    assert accepts(lt, g, toks(tk, lead + TWO[name])), name


@pytest.mark.parametrize("name", FORCED)
def test_forced_grammars_take_the_markers_as_tokens(vocab, name):
    tk, lt = vocab
    d, lm = BY_NAME[name], lits(tk, name)
    example = toks(tk, EXAMPLES[name])
    assert accepts(lt, d.grammar(TOOLS, None, lm), example), name
    assert accepts(lt, d.grammar(TOOLS, "get_weather", lm), example), name
    assert not accepts(lt, d.grammar(TOOLS, "get_time", lm), example), name
    specials = [t for t in example if lt.is_special_token(t)]
    if specials:  # the marker spelled out is not the marker
        assert lm.tokens and not accepts(lt, d.grammar(TOOLS, None, lm), spell(tk, EXAMPLES[name])), name
        assert not accepts(lt, d.grammar(TOOLS, None), example), name  # as the plain grammar had it
    # and what the grammar takes reads back as the call: a control token by its name
    pieces = marker_pieces(tk, d.markers)
    if name != "harmony":  # Harmony's reader starts at the opener's channel (test_dialects)
        text = b"".join(pieces[t] for t in example).decode()
        assert text == EXAMPLES[name]
        assert read(name, text)[1] == [("get_weather", ARGS.get(name, {"city": "Paris"}))], name


def test_reasoning_markers_may_come_before_the_call(vocab):
    tk, lt = vocab
    think, done = (tk.special_id(m) for m in THINK)
    call = toks(tk, EXAMPLES["hermes"])
    g = BY_NAME["hermes"].calls_grammar(TOOLS, None, parallel=False, lazy=True, lits=lits(tk, "hermes", THINK))
    assert accepts(lt, g, [think] + toks(tk, "The user wants the weather.") + [done] + toks(tk, "\n\n") + call)
    assert accepts(lt, g, [think] + toks(tk, "Nothing to call.") + [done] + toks(tk, "\n\nIt is sunny."))
    assert not accepts(lt, g, [think] + toks(tk, "hmm") + [done] + toks(tk, "\n\n<tool_call>\nhello"))
    assert not allows(lt, BY_NAME["hermes"].calls_grammar(TOOLS, None, parallel=False, lazy=True,
                                                          lits=lits(tk, "hermes")), [], think)
    # a text trigger (its vocabulary has no <tool_call> token) after special reasoning markers
    text_trigger = gr.Literals({m: t for m, t in zip(THINK, (think, done), strict=True)}, (think, done))
    g = BY_NAME["hermes"].calls_grammar(TOOLS, None, parallel=False, lazy=True, lits=text_trigger)
    spelled = spell(tk, "Let me check.\n" + EXAMPLES["hermes"])
    assert accepts(lt, g, [think] + toks(tk, "hmm") + [done] + toks(tk, "\n\n") + spelled)
    assert not accepts(lt, g, [think] + toks(tk, "hmm") + [done] + spell(tk, "\n<tool_call>\nhello"))


@pytest.fixture(scope="module")
def smollm2():
    return Tokenizer(embedded_model().path)  # no tool-call marker is a token of its own


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_text_markers_keep_the_grammars_they_had(smollm2, name):
    d = BY_NAME[name]
    lm = gr.Literals.of(smollm2, d.markers, THINK)
    assert lm.tokens == {} and lm.free == ()
    for parallel in (False, True):
        for lazy in (False, True):
            assert d.calls_grammar(TOOLS, None, parallel=parallel, lazy=lazy, lits=lm) == \
                d.calls_grammar(TOOLS, None, parallel=parallel, lazy=lazy), name


def test_literals_split_text_at_special_markers():
    lm = gr.Literals({"<tool_call>": 7, "<|a|>": 9, "<|a|><|a|>": 5})
    assert lm("\n<tool_call>\n") == '"\\n" <[7]> "\\n"'
    assert lm("<|a|><|a|><|a|>") == "<[5]> <[9]>"  # the longest marker first
    assert lm("") == "" and gr.PLAIN("") == ""
    assert lm("plain") == gr.PLAIN("plain") == '"plain"'
    assert lm.token("<tool_call>") == 7 and lm.token("tool_call") is None


def test_a_hugging_face_vocabulary_says_which_markers_are_special(tmp_path):
    from tokenizers import AddedToken, Tokenizer as Tok, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    tok = Tok(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}, merges=[]))
    tok.pre_tokenizer, tok.decoder = ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True), AddedToken("[TOOL_CALLS]", special=True)])
    tok.add_tokens([AddedToken("<tool_call>", special=False), AddedToken("[NOT_SPECIAL]", special=False)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    hf = HfTokenizer(str(tmp_path))
    lt = llguidance.LLTokenizer((tmp_path / "tokenizer.json").read_text(), eos_token=256)
    for marker in ("<|im_end|>", "[TOOL_CALLS]", "<tool_call>", "[NOT_SPECIAL]"):
        t = tok.token_to_id(marker)
        assert (hf.special_id(marker) == t) == lt.is_special_token(t), marker
    assert hf.special_id("[NOT_SPECIAL]") is None and hf.special_id("hello") is None


HARMONY_CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"


def test_harmony_auto_is_messages_until_one_is_opened_as_a_call(vocab):
    tk, lt = vocab
    lm = lits(tk, "harmony")
    channel, start = tk.special_id("<|channel|>"), tk.special_id("<|start|>")
    g = BY_NAME["harmony"].calls_grammar(TOOLS, None, parallel=True, lazy=True, lits=lm)
    assert f"<[{channel}]>" in g
    assert accepts(lt, g, toks(tk, "<|channel|>final<|message|>It is fine."))
    assert accepts(lt, g, toks(tk, ANALYSIS + "<|channel|>final<|message|>It is fine."))
    assert accepts(lt, g, toks(tk, "<|channel|>commentary<|message|>Checking." + ANALYSIS[-25:] + HARMONY_CALL))
    assert accepts(lt, g, toks(tk, ANALYSIS + HARMONY_CALL)) and accepts(lt, g, toks(tk, HARMONY_CALL))
    assert allows(lt, g, toks(tk, ANALYSIS), channel) and allows(lt, g, toks(tk, "<|channel|>analysis<|message|>"
                                                                             "hmm<|end|>"), start)
    # once the header names a function, the call is held: its name, then JSON, then the turn ends
    assert not accepts(lt, g, toks(tk, ANALYSIS + HARMONY_CALL.replace('{"city": "Paris"}', "hello")))
    assert not accepts(lt, g, toks(tk, ANALYSIS + HARMONY_CALL.replace("get_weather", "get_wether")))
    assert not accepts(lt, g, toks(tk, HARMONY_CALL + "<|end|><|start|>assistant" + HARMONY_CALL))
    assert not accepts(lt, g, toks(tk, "<|channel|>bogus<|message|>x"))  # a channel Harmony does not have
    assert not accepts(lt, g, spell(tk, ANALYSIS + HARMONY_CALL))  # the markers spelled out are not markers
    # what it takes reads back as the reasoning and the call
    text = b"".join(marker_pieces(tk, BY_NAME["harmony"].markers)[t] for t in toks(tk, ANALYSIS + HARMONY_CALL))
    ch = Channels(ChannelSpec(BY_NAME["harmony"]))
    p, end = ch.feed(text.decode()), ch.finish()
    assert p.reasoning == "The user wants the weather." and p.content + end.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in p.calls + end.calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("name, block, thought", [
    ("hermes", gr.Thinking(*THINK), "<think>\nThe user wants the weather.\n</think>\n\n"),
    ("deepseek", gr.Thinking(*THINK, inside=True), "The user wants the weather.\n</think>\n\n"),
    ("harmony", BY_NAME["harmony"].reasoning_block, ANALYSIS),
])
def test_a_forced_call_may_follow_reasoning_in_special_tokens(vocab, name, block, thought):
    tk, lt = vocab
    lm = lits(tk, name, THINK).thinking(block)
    g = BY_NAME[name].calls_grammar(TOOLS, None, parallel=False, lazy=False, lits=lm)
    call = toks(tk, EXAMPLES[name])
    assert accepts(lt, g, toks(tk, thought) + call)
    assert accepts(lt, g, call) != block.inside
    assert not accepts(lt, g, toks(tk, thought + "It is sunny."))
    assert not accepts(lt, g, spell(tk, thought) + call)  # its markers spelled out are not its markers
    close = tk.special_id(block.close) or tk.special_id(block.close[:len("<|end|>")])
    assert close is not None and allows(lt, g, toks(tk, thought.split(block.close)[0]), close)


def test_llama3_built_in_tools_follow_the_python_tag_token(vocab):
    from superfluid.codec.tools import tool_list

    tk, lt = vocab
    tag = tk.special_id("<|python_tag|>")
    tools = TOOLS + tool_list([{"type": "function", "function": {"name": "brave_search"}}])
    search = toks(tk, '<|python_tag|>brave_search.call(query="weather in Paris")')
    assert search[0] == tag
    for lazy in (False, True):
        g = BY_NAME["llama3"].calls_grammar(tools, None, parallel=False, lazy=lazy, lits=lits(tk, "llama3"))
        assert accepts(lt, g, search) and accepts(lt, g, toks(tk, EXAMPLES["llama3"]))
        assert not accepts(lt, g, toks(tk, "<|python_tag|>import os"))  # no code interpreter offered
    forced = BY_NAME["llama3"].grammar(tools, None, lits(tk, "llama3"))
    assert not accepts(lt, forced, spell(tk, '<|python_tag|>brave_search.call(query="weather in Paris")'))
    lazy = BY_NAME["llama3"].calls_grammar(tools, None, parallel=False, lazy=True, lits=lits(tk, "llama3"))
    assert accepts(lt, lazy, toks(tk, "Let me search. ") + search)
    assert not accepts(lt, lazy, toks(tk, "Let me search. <|python_tag|>brave_search.call(query=3)"))
