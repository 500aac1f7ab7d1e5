"""Qwen3-Coder (also Qwen3.5, Nemotron Nano 3): XML calls

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

The template lists the tools and renders past calls (arguments as an object). A parameter's
value is text; one that reads as JSON (a number, true, an object) is taken as that value, the
rest as a string."""

from __future__ import annotations

import json
import re

from ...request import ToolCall
from .. import grammar as gr
from ..tools import READ_ERRORS, new_call_id, too_deep
from .base import Delimited, Dialect, Parser, calls_lark, tool_names

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _value(text: str) -> object:
    if too_deep(text):
        return text
    try:
        v = json.loads(text)
    except READ_ERRORS:
        return text
    return v if not isinstance(v, str) else text


def read_xml(body: str) -> list[ToolCall] | None:
    calls = []
    for f in _FUNCTION.finditer(body):
        args = {m.group(1).strip(): _value(m.group(2)) for m in _PARAM.finditer(f.group(2))}
        calls.append(ToolCall(new_call_id(), f.group(1).strip(), json.dumps(args, ensure_ascii=False)))
    return calls or None


class Qwen3Coder(Dialect):
    name = "qwen3_coder"
    markers = ("<tool_call>", "</tool_call>")

    def detect(self, source: str) -> bool:
        return "<tool_call>" in source and "<function=" in source and "<parameter=" in source

    def parser(self) -> Parser:
        return Delimited("<tool_call>", "</tool_call>", read_xml)

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        """Each call its own <tool_call> block, the blocks a line apart (as the template writes
        them). A value is text without "<", so it cannot hold "</tool_call>" (nor "</parameter>")."""
        rules, funcs = [], []
        for i, (fn, params) in enumerate(tool_names(tools, name)):
            props = list((params.get("properties") or {}).keys())
            ps = []
            for j, p in enumerate(props):
                # one lexeme per parameter: its value is any text without "<"
                ps.append(f"P{i}_{j}")
                rules.append(f"P{i}_{j}: /{re.escape(f'<parameter={p}>')}\\n[^<]*\\n<\\/parameter>\\n/")
            body = f"({' | '.join(ps)})*" if ps else ""
            funcs.append(f"f{i}")
            rules.append(f"f{i}: {gr.lit(f'<function={fn}>' + chr(10))} {body} {gr.lit('</function>' + chr(10))}")
        return calls_lark(f"({' | '.join(funcs)}) {lits('</tool_call>')}", "\n".join(rules), opener="<tool_call>\n",
                          again="\n<tool_call>\n", tail="\n", parallel=parallel, lazy=lazy, lits=lits)


QWEN3_CODER = Qwen3Coder()
