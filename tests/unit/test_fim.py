"""The fill-in-the-middle prompt builder (codec/fim.py) on a fake vocabulary: which tokens it
finds, llama.cpp's layout, text that stays text, and extra files cut to a budget."""

import pytest

from superfluid.codec import fim
from superfluid.errors import BadRequest

BASE = 1000  # a character's token is BASE + its code point


class FakeVocab:
    """Characters are tokens; `specials` are parsed only with parse_special, like llama.cpp."""

    def __init__(self, specials: dict[str, int], meta: dict[str, str] | None = None, add_bos: bool = False):
        self.specials, self._meta = specials, meta or {}
        self.names = {t: s for s, t in specials.items()}
        self.n_vocab, self.bos, self.add_bos = BASE + 0x110000, 1, add_bos
        self.encoded: list[str] = []

    def meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        self.encoded.append(text)
        out, i = [], 0
        while i < len(text):
            hit = next((s for s in self.specials if parse_special and text.startswith(s, i)), None)
            if hit:
                out.append(self.specials[hit])
                i += len(hit)
            else:
                out.append(BASE + ord(text[i]))
                i += 1
        return out

    def token_text(self, token: int) -> bytes:
        return self.names[token].encode() if token in self.names else chr(token - BASE).encode()

    def show(self, tokens: list[int]) -> str:
        return "".join(f"[{self.names[t]}]" if t in self.names else chr(t - BASE) for t in tokens)


QWEN = {"<|fim_prefix|>": 10, "<|fim_suffix|>": 11, "<|fim_middle|>": 12, "<|fim_pad|>": 13,
        "<|repo_name|>": 14, "<|file_sep|>": 15, "<|endoftext|>": 2}
STARCODER = {"<fim_prefix>": 20, "<fim_middle>": 21, "<fim_suffix>": 22, "<fim_pad>": 23, "<reponame>": 24}


def test_tokens_are_found_by_name_in_llama_cpp_spellings():
    assert fim.find(FakeVocab(QWEN)) == fim.FimTokens(pre=10, suf=11, mid=12, pad=13, rep=14, sep=15)
    assert fim.find(FakeVocab(STARCODER)) == fim.FimTokens(pre=20, suf=22, mid=21, pad=23, rep=24, sep=-1)
    assert fim.find(FakeVocab({"▁<PRE>": 5, "▁<SUF>": 6, "▁<MID>": 7})) == fim.FimTokens(5, 6, 7)


def test_metadata_ids_come_before_names():
    meta = {"tokenizer.ggml.fim_pre_token_id": "30", "tokenizer.ggml.fim_suf_token_id": "31",
            "tokenizer.ggml.fim_mid_token_id": "32", "tokenizer.ggml.fim_sep_token_id": "not a number"}
    assert fim.find(FakeVocab(QWEN, meta)) == fim.FimTokens(pre=30, suf=31, mid=32, pad=13, rep=14, sep=15)


def test_a_model_without_fim_tokens_is_a_400_naming_the_parameter():
    chatml = FakeVocab({"<|im_start|>": 1, "<|im_end|>": 2, "<reponame>": 4})
    assert fim.find(chatml) is None
    with pytest.raises(BadRequest) as e:
        fim.tokens_of(chatml, "input_suffix", "the model m")
    assert e.value.param == "input_suffix" and e.value.status == 400 and "the model m" in e.value.message
    with pytest.raises(BadRequest) as e:
        fim.fill(FakeVocab({"<fim_prefix>": 1, "<fim_suffix>": 2}), "a", "b", "suffix")  # no middle token
    assert e.value.param == "suffix"


def test_psm_layout_and_user_text_stays_text():
    v = FakeVocab(STARCODER)
    toks = fim.fill(v, "def f(<fim_middle>):\n    ", "\n    return x\n", "suffix")
    assert v.show(toks) == "[<fim_prefix>]def f(<fim_middle>):\n    [<fim_suffix>]\n    return x\n[<fim_middle>]"
    assert toks.count(21) == 1 and toks[-1] == 21  # the typed marker is characters, only the last is the token
    assert fim.fill(v, [7, 8], "", "suffix") == [20, 7, 8, 22, 21]  # a tokenized prompt goes in as it is


def test_bos_when_the_model_wants_one_and_prompt_after_the_prefix():
    v = FakeVocab(STARCODER, add_bos=True)
    toks = fim.infill_prompt(v, fim.find(v), "a", "z", prompt="b")
    assert toks[0] == 1 and v.show(toks[1:]) == "[<fim_prefix>]ab[<fim_suffix>]z[<fim_middle>]"


def test_extra_files_in_the_repo_level_format():
    v = FakeVocab(QWEN)
    toks = fim.infill_prompt(v, fim.find(v), "p", "s", files=[("a.py", "A"), ("b.py", "B")], budget=1000)
    assert v.show(toks) == ("[<|repo_name|>]myproject\n[<|file_sep|>]a.py\nA[<|file_sep|>]b.py\nB"
                            "[<|file_sep|>]filename\n[<|fim_prefix|>]p[<|fim_suffix|>]s[<|fim_middle|>]")


def test_extra_files_as_plain_snippets_without_a_file_separator():
    v = FakeVocab({**STARCODER, "<reponame>": 24})
    toks = fim.infill_prompt(v, fim.find(v), "p", "s", files=[("", "A")], budget=1000)
    assert v.show(toks) == "[<reponame>]myproject\n\n\n--- snippet ---\n\nA[<fim_prefix>]p[<fim_suffix>]s[<fim_middle>]"


def test_extra_files_are_cut_from_the_front_to_the_budget_and_never_tokenized_past_it():
    v = FakeVocab(QWEN)
    core = fim.infill_prompt(v, fim.find(v), "p", "s")
    files = [(f"f{i}", "x" * 10_000) for i in range(50)] + [("last", "0123456789")]
    v.encoded.clear()
    toks = fim.infill_prompt(v, fim.find(v), "p", "s", files=files, budget=len(core) + 30)
    assert len(toks) == len(core) + 30 and toks[-len(core):] == core
    assert v.show(toks[:-len(core)]).endswith("[<|file_sep|>]last\n0123456789[<|file_sep|>]filename\n")
    assert sum(len(t) for t in v.encoded) < 30 * fim.MAX_CHARS_PER_TOKEN + 200  # not 500,000 characters
    assert fim.infill_prompt(v, fim.find(v), "p", "s", files=files, budget=len(core) - 5) == core
