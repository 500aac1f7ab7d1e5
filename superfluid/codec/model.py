"""A model's codec, built once per model and shared by the service, the engine and the
fleet head: its tokenizer, its chat template, the tool-call dialect the template uses and
the reasoning markers it writes."""

from __future__ import annotations

from dataclasses import dataclass

from .channels import reasoning_markers
from .template import ChatTemplate
from .tokenizer import Tokenizer
from .tools import ToolFormat
from .tools import detect as detect_tool_format


@dataclass(frozen=True, slots=True)
class Codec:
    tokenizer: Tokenizer
    template: ChatTemplate
    tool_format: ToolFormat
    reasoning: tuple[str, str] | None

    @classmethod
    def of(cls, tokenizer: Tokenizer, chat_template: str | None = None) -> Codec:
        """The codec of a model: its own chat template unless `chat_template` replaces it."""
        tt = tokenizer.token_text
        template = ChatTemplate(chat_template or tokenizer.chat_template,
                                bos=tt(tokenizer.bos).decode() if tokenizer.bos >= 0 else "",
                                eos=tt(tokenizer.eos).decode() if tokenizer.eos >= 0 else "")
        return cls(tokenizer, template, detect_tool_format(template.source), reasoning_markers(template.source))
