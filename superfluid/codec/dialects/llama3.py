"""Llama 3.1 / 3.2 / 3.3: a reply that is a call is one JSON object
`{"name": ..., "parameters": {...}}` (several may follow each other, separated by `;`), or
starts with the `<|python_tag|>` token. The template lists the tools and renders past calls."""

from __future__ import annotations

import json

from ...request import ToolCall
from .. import grammar as gr
from ..tools import call_from
from .base import Delimited, Dialect, Parser, Parts, calls_lark

PYTHON_TAG = "<|python_tag|>"
# prose: a reply that does not start with "{" (one that does is read as calls)
_PROSE = r"(\s*[^{\s](.|\n)*)?"


def json_objects(body: str) -> list[ToolCall] | None:
    """Calls from one or more JSON objects separated by whitespace, `;` or `,`."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(body) and body[i] in " \t\r\n;,":
            i += 1
        if i >= len(body):
            break
        try:
            obj, i = dec.raw_decode(body, i)
        except ValueError:
            return None
        call = call_from(obj)
        if call is None:
            return None
        out.append(call)
    return out or None


class _Reply(Delimited):
    """A reply whose first character is `{` is read whole as calls; otherwise calls follow
    the `<|python_tag|>` marker."""

    def __init__(self) -> None:
        super().__init__(PYTHON_TAG, "", json_objects)
        self._started = False
        self._lead = ""  # the whitespace before a bare JSON reply (given back if it is no call)

    def feed(self, text: str) -> Parts:
        if not self._started:
            self._lead += text
            stripped = self._lead.lstrip()
            if not stripped:
                return Parts()
            self._started = True
            text, self._lead = self._lead, ""
            if stripped.startswith("{"):
                self._inside, self.open = True, ""
                self._lead = text[:len(text) - len(stripped)]
                text = stripped
        return super().feed(text)

    def finish(self) -> Parts:
        if not self._started:
            return Parts(self._lead)
        out = super().finish()
        if out.content and not self.open:
            out.content = self._lead + out.content
        return out

    @property
    def holding(self) -> bool:
        return bool(self._lead) or super().holding


class Llama3(Dialect):
    name = "llama3"
    markers = (PYTHON_TAG,)

    def detect(self, source: str) -> bool:
        return PYTHON_TAG in source or "<|start_header_id|>ipython" in source or (
            "<|start_header_id|>" in source and "ipython" in source)

    def parser(self) -> Parser:
        return _Reply()

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        """Bare JSON calls `{"name": ..., "parameters": {...}}` separated by "; ". Lazy: a reply
        that starts with "{" is calls, and so is what follows `<|python_tag|>` after prose. The
        calls run to the end of the reply: no closing marker to keep out of strings."""
        schema = gr.call_schema(tools, name)
        opts = schema.get("anyOf", [schema])
        for o in opts:
            o["properties"]["parameters"] = o["properties"].pop("arguments")
            o["required"] = ["name", "parameters"]
        call = gr.json_rule(opts[0] if len(opts) == 1 else {"anyOf": opts})
        return calls_lark("call", f"call: {call}", opener="", again="; ", trigger=PYTHON_TAG, text=_PROSE, bare=True,
                          parallel=parallel, lazy=lazy, lits=lits)


LLAMA3 = Llama3()
