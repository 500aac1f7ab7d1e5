"""IBM Granite 3.x: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]` to the end of the
turn. The template lists the tools (`available_tools`) but writes no past calls, so they go
into the assistant's text in the same syntax. With `thinking` on, Granite writes
`<think>...</think><response>...</response>`: the reasoning is split by the <think> markers
(codec/channels.py) and the <response> tags are dropped from the content, so this reader
runs on every reply."""

from __future__ import annotations

import json

from .. import grammar as gr
from ..tools import args_obj
from .base import Delimited, Dialect, Parser, calls_lark, json_calls

TOOL_CALL = "<|tool_call|>"
RESPONSE = ("<response>", "</response>")


class Granite(Dialect):
    name = "granite"
    structured = True
    native_calls = False
    markers = (TOOL_CALL,)

    def detect(self, source: str) -> bool:
        return TOOL_CALL in source or "<|start_of_role|>" in source

    def parser(self) -> Parser:
        return Delimited(TOOL_CALL, "", json_calls, strip=RESPONSE)

    def call_text(self, calls: list[dict]) -> str:
        return TOOL_CALL + json.dumps([{"name": c["function"]["name"],
                                        "arguments": args_obj(c["function"]["arguments"])} for c in calls],
                                      ensure_ascii=False)

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        # the call list runs to the end of the turn: no closing marker to keep out of strings
        call = gr.json_rule(gr.call_schema(tools, name))
        return calls_lark("call", f"call: {call}", opener=TOOL_CALL + "[", again=", ", closer="]",
                          trigger=TOOL_CALL, parallel=parallel, lazy=lazy, lits=lits)


GRANITE = Granite()
