"""Grammars for constrained output, compiled by llguidance and enforced in the worker as a
token mask (runtime/sampling.py): JSON objects, JSON schemas, and tool calls in the wire
format the model's template uses. A schema llguidance cannot compile is a 400 before
anything runs, never an unconstrained answer."""

from __future__ import annotations

import json

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import gbnf_to_lark

from ..errors import BadRequest
from ..limits import MAX_GRAMMAR_BYTES, check_schema

# No free whitespace: a small model given "any whitespace here" can spend its whole budget
# on newlines. Separators stay readable.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _checked(grammar: str, param: str) -> str:
    err = LLMatcher.validate_grammar(grammar)
    if err:
        raise BadRequest(f"the schema cannot be enforced: {err}", param=param)
    return grammar


def json_schema(schema: object, param: str = "response_format") -> str:
    if not isinstance(schema, dict):
        raise BadRequest("a JSON schema must be an object", param=param)
    check_schema(schema, param)
    try:
        g = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    except (ValueError, TypeError) as e:
        raise BadRequest(f"the schema cannot be enforced: {e}", param=param) from None
    return _checked(g, param)


def json_object(param: str = "response_format") -> str:
    return json_schema({"type": "object"}, param)


def call_schema(tools: list[dict], name: str | None = None) -> dict:
    """The JSON schema of one call `{"name": ..., "arguments": {...}}` to one of `tools`
    (OpenAI-shaped: {"type": "function", "function": {"name", "parameters"}})."""
    options = []
    for t in tools:
        fn = t.get("function") or {}
        if name is not None and fn.get("name") != name:
            continue
        params = fn.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": fn.get("name")}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    if not options:
        raise BadRequest(f"tool_choice names a function that is not in tools: {name}", param="tool_choice")
    return options[0] if len(options) == 1 else {"anyOf": options}


def json_rule(schema: dict) -> str:
    """A lark rule body: one JSON value that matches schema, laid out as JSON_OPTIONS says."""
    return (f"%json {{\"x-guidance\": {json.dumps(JSON_OPTIONS)}, "
            f"\"allOf\": [{json.dumps(schema, separators=(',', ':'), ensure_ascii=False)}]}}")


def lit(text: str) -> str:
    """A lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def lark(text: str, param: str = "tool_choice") -> str:
    """A grammar from lark rules (the dialects' call grammars), checked before anything runs."""
    return _checked(LLMatcher.grammar_from_lark("%llguidance {}\n" + text), param)


def gbnf(source: str, param: str = "grammar") -> str:
    """A llama.cpp GBNF grammar (llama-server's `grammar`), converted by llguidance."""
    if len(source) > MAX_GRAMMAR_BYTES:
        raise BadRequest(f"the grammar is over {MAX_GRAMMAR_BYTES} characters", param=param)
    try:
        text = gbnf_to_lark(source)
    except Exception as e:  # GbnfToLarkError, RecursionError, and a bare Exception for an undefined rule
        raise BadRequest(f"the grammar cannot be enforced: {e}", param=param) from None
    return _checked(LLMatcher.grammar_from_lark(text), param)


def tool_call(tools: list[dict], name: str | None, open_tag: str, close_tag: str) -> str:
    """Exactly one JSON call {"name", "arguments"} wrapped in markers (Hermes: <tool_call>...</tool_call>)."""
    return lark(f"start: {lit(open_tag)} call {lit(close_tag)}\n"
                f"call: {json_rule(call_schema(tools, name))}\n")
