"""Fill-in-the-middle prompts: a model's FIM tokens and llama.cpp's infill layout.

The tokens come from the GGUF metadata (tokenizer.ggml.fim_pre_token_id, ...) when it names
them, else from the vocabulary by the names llama.cpp looks for (`<|fim_prefix|>`,
`<fim_prefix>`, `<PRE>`, ...). The layout is llama-server's format_infill, PSM order:

    [FIM_REP]myproject\\n [FIM_SEP]name\\n text ... [FIM_SEP]filename\\n      (the extra files)
    [BOS] FIM_PRE prefix prompt FIM_SUF suffix FIM_MID

A model without FIM_SEP gets each extra file after a plain-text "--- snippet ---" line. The
special tokens go in as ids; the caller's text is tokenized without special-token parsing,
so a user who types `<fim_middle>` gets those characters, not the token."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import BadRequest

# llama.cpp's names for each kind (llama-vocab.cpp), in its order
NAMES: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>", "<fim-sep>", "<SEP>"),
}
META = "tokenizer.ggml.fim_{}_token_id"
REPO = "myproject\n"  # llama-server's fixed project name and current file name
FILENAME = "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"  # an extra file's header when the model has no FIM_SEP
MAX_CHARS_PER_TOKEN = 64  # more characters than any one token covers


class FimVocab(Protocol):
    """What the builder needs of a tokenizer (codec.tokenizer.Vocab has it)."""
    n_vocab: int
    bos: int
    add_bos: bool

    def meta(self, key: str) -> str | None: ...

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]: ...

    def token_text(self, token: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    pad: int = -1  # -1: the model has none
    rep: int = -1
    sep: int = -1


def _by_meta(vocab: FimVocab, kind: str) -> int:
    raw = vocab.meta(META.format(kind))
    if raw is None or not raw.strip().isdigit():
        return -1
    t = int(raw)
    return t if 0 <= t < vocab.n_vocab else -1


def _by_name(vocab: FimVocab, kind: str) -> int:
    for name in NAMES[kind]:
        ids = vocab.encode(name, parse_special=True)
        if len(ids) == 1 and vocab.token_text(ids[0]) == name.encode():
            return ids[0]
    return -1


def find(vocab: FimVocab) -> FimTokens | None:
    """The model's FIM tokens, or None when it lacks a prefix, suffix or middle token."""
    ids = {k: (t if (t := _by_meta(vocab, k)) >= 0 else _by_name(vocab, k)) for k in NAMES}
    if min(ids["pre"], ids["suf"], ids["mid"]) < 0:
        return None
    return FimTokens(**ids)


_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tokens_of(vocab: FimVocab, param: str, model: str = "this model") -> FimTokens:
    """The model's FIM tokens (looked up once per tokenizer), or a 400 naming `param`."""
    try:
        fim = _FOUND[vocab]
    except (KeyError, TypeError):
        fim = find(vocab)
        try:
            _FOUND[vocab] = fim
        except TypeError:
            pass
    if fim is None:
        raise BadRequest(f"{model} has no fill-in-the-middle tokens (FIM prefix, suffix and middle): "
                         f"it cannot complete between a prefix and a suffix", param=param)
    return fim


def _text(vocab: FimVocab, s: str) -> list[int]:
    return vocab.encode(s, parse_special=False) if s else []


def extra_tokens(vocab: FimVocab, fim: FimTokens, files: Sequence[tuple[str, str]], budget: int) -> list[int]:
    """The extra files as repo-level context, at most `budget` tokens of it: like llama.cpp,
    the last ones (nearest the code) are kept. Files that would fall wholly outside the budget
    are never tokenized, so a request's work is bounded by the window, not its size."""
    if budget <= 0:
        return []
    tail: list[list[int]] = []
    if fim.sep >= 0:
        tail.append([fim.sep, *_text(vocab, FILENAME)])
    n = sum(map(len, tail))
    for name, text in reversed(files):
        if n >= budget:
            break
        head = [fim.sep, *_text(vocab, (name or "tmp") + "\n")] if fim.sep >= 0 else _text(vocab, SNIPPET)
        # only its end can be kept: tokenize no more of it than could fill what is left
        part = head + _text(vocab, text[-(budget - n) * MAX_CHARS_PER_TOKEN:])
        tail.append(part)
        n += len(part)
    if n < budget and fim.rep >= 0:
        tail.append([fim.rep, *_text(vocab, REPO)])
    out = [t for part in reversed(tail) for t in part]
    return out[-budget:]


def infill_prompt(vocab: FimVocab, fim: FimTokens, prefix: str | list[int], suffix: str, *,
                  files: Sequence[tuple[str, str]] = (), prompt: str = "", budget: int = 0) -> list[int]:
    """llama.cpp's infill prompt: extra files (cut to `budget` tokens less the rest of the
    prompt), BOS when the model wants one, then FIM_PRE prefix prompt FIM_SUF suffix FIM_MID.
    `prefix` may be token ids already (a tokenized /v1/completions prompt)."""
    pre = list(prefix) if isinstance(prefix, list) else _text(vocab, prefix)
    core = [fim.pre, *pre, *_text(vocab, prompt), fim.suf, *_text(vocab, suffix), fim.mid]
    if vocab.add_bos and vocab.bos >= 0:
        core.insert(0, vocab.bos)
    if not files:
        return core
    return extra_tokens(vocab, fim, files, budget - len(core)) + core


def fill(vocab: FimVocab, prefix: str | list[int], suffix: str, param: str, model: str = "this model") -> list[int]:
    """A completion prompt with a suffix (OpenAI /v1/completions, Ollama /api/generate): the
    prompt is the text (or token ids) before the gap. No FIM tokens: a 400 naming `param`."""
    return infill_prompt(vocab, tokens_of(vocab, param, model), prefix, suffix)
