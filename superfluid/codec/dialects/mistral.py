"""Mistral (Nemo, Small, 7B v0.3): `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]`
to the end of the turn. The template lists the tools and renders past calls; it insists on
call ids of nine letters and digits, so ours are mapped onto such ids."""

from __future__ import annotations

import hashlib
import re

from .. import grammar as gr
from .base import Delimited, Dialect, Parser, calls_lark, json_calls, tool_names

TOOL_CALLS = "[TOOL_CALLS]"
_ID = re.compile(r"[a-zA-Z0-9]{9}")


def short_id(call_id: str) -> str:
    """A call id as Mistral's template accepts it: nine letters and digits, the same for a
    call and its result."""
    if _ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


class Mistral(Dialect):
    name = "mistral"
    markers = (TOOL_CALLS,)

    def detect(self, source: str) -> bool:
        return TOOL_CALLS in source

    def parser(self) -> Parser:
        return Delimited(TOOL_CALLS, "", json_calls)

    def render_call(self, message: dict, calls: list[dict]) -> dict:
        return super().render_call(message, [{**c, "id": short_id(str(c.get("id") or ""))} for c in calls])

    def tool_result(self, message: dict) -> dict:
        return {**message, "tool_call_id": short_id(str(message.get("tool_call_id") or ""))}

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        # the call list runs to the end of the turn: no closing marker to keep out of strings
        opts = [{"type": "object", "properties": {"name": {"const": n}, "arguments": params,
                                                  "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}},
                 "required": ["name", "arguments"], "additionalProperties": False}
                for n, params in tool_names(tools, name)]
        schema = opts[0] if len(opts) == 1 else {"anyOf": opts}
        return calls_lark("call", f"call: {gr.json_rule(schema)}", opener=TOOL_CALLS + "[", again=", ", closer="]",
                          trigger=TOOL_CALLS, parallel=parallel, lazy=lazy, lits=lits)


MISTRAL = Mistral()
