"""DeepSeek: calls between `<｜tool▁calls▁begin｜>` and `<｜tool▁calls▁end｜>`, each
`<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`:
- `deepseek` (V3, R1 and its distills): `function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n````;
- `deepseek_v3_1` (V3.1): `NAME<｜tool▁sep｜>{...}`.
Neither template lists the tools, so a system note does, in the model's own syntax. R1's
template writes past calls only for an assistant turn whose content is null, with the
arguments as a string. Reasoning is `<think>` (the R1 opener already opened it)."""

from __future__ import annotations

import json
import re

from ...request import ToolCall
from .. import grammar as gr
from ..tools import new_call_id, parse_json
from .base import Delimited, Dialect, Parser, calls_lark, one_of, tool_names

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
AVOID = "<｜tool▁call"  # the start of both closing markers (a call's and the block's)
_CALL = re.compile(re.escape(CALL) + "(.*?)" + re.escape(CALL_END), re.S)
_FENCED = re.compile(r"\s*([^\n]+?)\s*\n```(?:json)?\n(.*?)\n?```\s*$", re.S)


def read_calls(body: str) -> list[ToolCall] | None:
    calls = []
    for m in _CALL.finditer(body):
        left, sep, right = m.group(1).partition(SEP)
        if not sep:
            return None
        fenced = _FENCED.match(right)
        name, args = (fenced.group(1), fenced.group(2)) if fenced else (left.strip(), right.strip())
        if not isinstance(parse_json(args), dict):
            return None
        calls.append(ToolCall(new_call_id(), name, args.strip()))
    return calls or None


def _note(tools: list[dict], example: str) -> str:
    lines = [f"### {t['function']['name']}\nDescription: {t['function'].get('description', '')}\n\n"
             f"Parameters: {json.dumps(t['function']['parameters'], ensure_ascii=False)}" for t in tools]
    return ("## Tools\nYou have access to the following tools:\n\n" + "\n\n".join(lines) +
            "\n\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n" + example)


class DeepSeek(Dialect):
    """V3 / R1: fenced JSON arguments after the function's name."""
    name = "deepseek"
    native = False
    args_as_text = True
    markers = (BEGIN, END, CALL, CALL_END, SEP, "<think>", "</think>")

    def detect(self, source: str) -> bool:
        return CALL in source and "```json" in source

    def parser(self) -> Parser:
        return Delimited(BEGIN, END, read_calls)

    def note(self, tools: list[dict]) -> str:
        example = f"{BEGIN}{CALL}function{SEP}tool_call_name\n```json\ntool_call_arguments\n```{CALL_END}{END}"
        return _note(tools, example)

    def render_call(self, message: dict, calls: list[dict]) -> dict:
        return {**super().render_call(message, calls), "content": None}

    def _head(self, fn: str) -> str:
        return f"function{SEP}{fn}\n```json\n"

    _tail = "\n```"
    _again = "\n" + CALL  # R1's template writes each further call on a new line

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        # an argument string cannot hold a closing marker: the reader would end the call there
        call, rules = one_of([f"{lits(self._head(fn))} {gr.json_rule(gr.guarded(params, AVOID))} "
                              f"{lits(self._tail + CALL_END)}" for fn, params in tool_names(tools, name)])
        return calls_lark(call, rules, opener=BEGIN + CALL, again=self._again, closer=END, trigger=BEGIN,
                          parallel=parallel, lazy=lazy, lits=lits)


class DeepSeekV31(DeepSeek):
    """V3.1: bare JSON arguments after the name and the separator."""
    name = "deepseek_v3_1"
    args_as_text = False

    def detect(self, source: str) -> bool:
        return CALL in source

    def note(self, tools: list[dict]) -> str:
        return _note(tools, f"{BEGIN}{CALL}tool_call_name{SEP}tool_call_arguments{CALL_END}{END}")

    def render_call(self, message: dict, calls: list[dict]) -> dict:
        return Dialect.render_call(self, message, calls)

    def _head(self, fn: str) -> str:
        return f"{fn}{SEP}"

    _tail = ""
    _again = CALL  # V3.1's template writes the calls one after the other


DEEPSEEK = DeepSeek()
DEEPSEEK_V3_1 = DeepSeekV31()
