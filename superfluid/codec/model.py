"""A model's codec, built once per model and shared by the service, the engine and the
fleet head: its tokenizer, its chat template, the tool-call dialect the template uses (or
the one `--tool-dialect` names), the reasoning markers it writes, and the token pieces
replies are detokenized with (the dialect's special-token markers as their names)."""

from __future__ import annotations

from dataclasses import dataclass

from .channels import reasoning_markers
from .dialects import Dialect, by_name
from .dialects import detect as detect_dialect
from .template import ChatTemplate
from .tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Codec:
    tokenizer: Tokenizer
    template: ChatTemplate
    tool_format: Dialect
    reasoning: tuple[str, str] | None
    pieces: list[bytes]  # each token's text in a reply

    @classmethod
    def of(cls, tokenizer: Tokenizer, chat_template: str | None = None, tool_dialect: str | None = None) -> Codec:
        """The codec of a model: its own chat template unless `chat_template` replaces it,
        the dialect detected from the template unless `tool_dialect` names one."""
        tt = tokenizer.token_text
        template = ChatTemplate(chat_template or tokenizer.chat_template,
                                bos=tt(tokenizer.bos).decode() if tokenizer.bos >= 0 else "",
                                eos=tt(tokenizer.eos).decode() if tokenizer.eos >= 0 else "")
        dialect = by_name(tool_dialect) if tool_dialect else detect_dialect(template.source)
        reasoning = None if dialect.own_reasoning else reasoning_markers(template.source)
        markers = dialect.markers + (reasoning or ())
        return cls(tokenizer, template, dialect, reasoning, marker_pieces(tokenizer, markers))


def marker_pieces(tokenizer: Tokenizer, markers: tuple[str, ...]) -> list[bytes]:
    """The tokenizer's pieces, with special tokens that spell one of the markers given their
    text: a control token (Mistral's [TOOL_CALLS], Harmony's <|channel|>) detokenizes to
    nothing otherwise, and the dialect's reader could not see it."""
    pieces = tokenizer.pieces
    named: dict[int, bytes] = {}
    for m in markers:
        ids = tokenizer.encode(m, parse_special=True)
        if len(ids) == 1 and 0 <= ids[0] < len(pieces) and not pieces[ids[0]]:
            named[ids[0]] = m.encode()
    if not named:
        return pieces
    out = list(pieces)
    for t, b in named.items():
        out[t] = b
    return out
