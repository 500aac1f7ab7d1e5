"""Llama 3.1 / 3.2 / 3.3: a reply that is a call is one JSON object
`{"name": ..., "parameters": {...}}` (several may follow each other, separated by `;`), or
starts with the `<|python_tag|>` token. The template lists the tools and renders past calls.

Llama 3.1's built-in tools (the template's `builtin_tools`): a tool offered under one of
their names is also listed there, and the model calls it after `<|python_tag|>` as
`brave_search.call(query="...")`, or, for the code interpreter, writes the code itself:

    <|python_tag|>wolfram_alpha.call(query="integral of x^2")
    <|python_tag|>import math
    print(math.sqrt(2))

Both are read as calls (arguments {"query": ...} / {"code": ...}); the template renders
past ones in the first form (ending the turn with `<|eom_id|>`) and their results as
`ipython` turns."""

from __future__ import annotations

import ast
import json

from ...request import ToolCall
from .. import grammar as gr
from ..tools import READ_ERRORS, call_from, new_call_id, too_deep
from .base import Delimited, Dialect, Parser, Parts, calls_lark, one_of

PYTHON_TAG = "<|python_tag|>"
# Llama 3.1's built-in tools and the one argument each takes
BUILTIN = {"brave_search": "query", "wolfram_alpha": "query", "code_interpreter": "code"}
CODE = "code_interpreter"
# prose: a reply that does not start with "{" (one that does is read as calls)
_PROSE = r"(\s*[^{\s](.|\n)*)?"


def json_objects(body: str) -> list[ToolCall] | None:
    """Calls from one or more JSON objects separated by whitespace, `;` or `,`."""
    if too_deep(body):
        return None
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(body) and body[i] in " \t\r\n;,":
            i += 1
        if i >= len(body):
            break
        try:
            obj, i = dec.raw_decode(body, i)
        except READ_ERRORS:
            return None
        call = call_from(obj)
        if call is None:
            return None
        out.append(call)
    return out or None


def builtin_call(body: str) -> list[ToolCall] | None:
    """One `name.call(key=value, ...)` (values are literals: JSON strings, numbers, ...)."""
    try:
        node = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(node, ast.Call) or node.args:
        return None
    fn = node.func
    if not (isinstance(fn, ast.Attribute) and fn.attr == "call" and isinstance(fn.value, ast.Name)):
        return None
    try:
        args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    except READ_ERRORS:
        return None
    return [ToolCall(new_call_id(), fn.value.id, json.dumps(args, ensure_ascii=False))]


def tagged_calls(body: str) -> list[ToolCall] | None:
    """What follows `<|python_tag|>`: JSON calls, a built-in tool's `.call(...)`, or else
    code for the code interpreter."""
    code = body.strip()
    if not code:
        return None
    return json_objects(body) or builtin_call(body) or \
        [ToolCall(new_call_id(), CODE, json.dumps({"code": code}, ensure_ascii=False))]


class _Reply(Delimited):
    """A reply whose first character is `{` is read whole as calls; otherwise calls follow
    the `<|python_tag|>` marker."""

    def __init__(self) -> None:
        super().__init__(PYTHON_TAG, "", tagged_calls)
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
                self._inside, self.open, self.read = True, "", json_objects
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

    def render(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], dict]:
        """As the template wants it, with the built-in tools offered named in `builtin_tools`
        (they stay in `tools` too: Llama 3.2's template knows no built-in tools)."""
        out, extra = super().render(messages, tools)
        names = [t["function"]["name"] for t in tools or [] if t["function"]["name"] in BUILTIN]
        if names:
            extra["builtin_tools"] = names
        return out, extra

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        """Bare JSON calls `{"name": ..., "parameters": {...}}` separated by "; ". Lazy: a reply
        that starts with "{" is calls, and so is what follows `<|python_tag|>` after prose. The
        calls run to the end of the reply: no closing marker to keep out of strings. A built-in
        tool offered may be called alone after `<|python_tag|>` (`NAME.call(ARG=...)`, the
        argument as its schema says, a string by default), and with the code interpreter
        offered any code may follow the tag."""
        schema = gr.call_schema(tools, name)
        opts = schema.get("anyOf", [schema])
        for o in opts:
            o["properties"]["parameters"] = o["properties"].pop("arguments")
            o["required"] = ["name", "parameters"]
        call = gr.json_rule(opts[0] if len(opts) == 1 else {"anyOf": opts})
        alone, rules = _builtins(tools, name)
        return calls_lark("call", f"call: {call}\n{rules}", opener="", again="; ", trigger=PYTHON_TAG, text=_PROSE,
                          bare=True, alone=alone, parallel=parallel, lazy=lazy, lits=lits)


def _builtins(tools: list[dict], name: str | None) -> tuple[str, str]:
    """The built-in tools' calls after `<|python_tag|>`: a lark expression ("" for none offered)
    and its rules."""
    bodies = []
    for t in tools:
        fn = t["function"]
        arg = BUILTIN.get(fn["name"])
        if arg is None or name not in (None, fn["name"]):
            continue
        value = ((fn.get("parameters") or {}).get("properties") or {}).get(arg) or {"type": "string"}
        bodies.append(f"{gr.lit(fn['name'] + '.call(' + arg + '=')} {gr.json_rule(value)} {gr.lit(')')}")
        if arg == "code":
            bodies.append("CODE")
    if not bodies:
        return "", ""
    alone, rules = one_of(bodies, "builtin")
    return alone, rules + "\nCODE: /(.|\\n)+/" if "CODE" in bodies else rules


LLAMA3 = Llama3()
