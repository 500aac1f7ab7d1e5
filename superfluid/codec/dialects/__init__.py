"""Tool-call dialects, one module each, and how a model's is chosen: the first whose
`detect` matches the chat template's source, in this order (the more specific markers
first, as llama.cpp's chat parser does), unless `--tool-dialect` names one."""

from __future__ import annotations

from ...errors import BadRequest
from .base import Dialect, Parser, Parts
from .deepseek import DEEPSEEK, DEEPSEEK_V3_1
from .functionary import FUNCTIONARY
from .gemma import GEMMA
from .granite import GRANITE
from .harmony import HARMONY
from .hermes import GENERIC, HERMES
from .llama3 import LLAMA3
from .mistral import MISTRAL
from .qwen3_coder import QWEN3_CODER

ORDER: tuple[Dialect, ...] = (HARMONY, FUNCTIONARY, DEEPSEEK, DEEPSEEK_V3_1, QWEN3_CODER, HERMES, GRANITE,
                              MISTRAL, LLAMA3, GEMMA, GENERIC)
BY_NAME = {d.name: d for d in ORDER}


def names() -> list[str]:
    return list(BY_NAME)


def detect(template_source: str) -> Dialect:
    return next(d for d in ORDER if d.detect(template_source))


def by_name(name: str) -> Dialect:
    try:
        return BY_NAME[name]
    except KeyError:
        raise BadRequest(f"unknown tool dialect {name!r}: use one of {', '.join(BY_NAME)}",
                         param="tool_dialect") from None


__all__ = ["BY_NAME", "DEEPSEEK", "DEEPSEEK_V3_1", "FUNCTIONARY", "GEMMA", "GENERIC", "GRANITE", "HARMONY", "HERMES",
           "LLAMA3", "MISTRAL", "ORDER", "QWEN3_CODER", "Dialect", "Parser", "Parts", "by_name", "detect", "names"]
