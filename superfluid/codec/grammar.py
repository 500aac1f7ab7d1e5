"""Grammars for constrained output, compiled by llguidance and enforced in the worker as a
token mask (runtime/sampling.py): JSON objects, JSON schemas, and tool calls in the wire
format the model's template uses. A schema llguidance cannot compile is a 400 before
anything runs, never an unconstrained answer; a tool's schema is enforced leniently
(json_rule)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

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


def call_schema(tools: list[dict], name: str | None = None, avoid: str = "") -> dict:
    """The JSON schema of one call `{"name": ..., "arguments": {...}}` to one of `tools`
    (OpenAI-shaped: {"type": "function", "function": {"name", "parameters"}}); its strings
    never contain `avoid` (the dialect's closing marker, see guarded)."""
    options = []
    for t in tools:
        fn = t.get("function") or {}
        if name is not None and fn.get("name") != name:
            continue
        params = guarded(fn.get("parameters") or {"type": "object"}, avoid)
        options.append({"type": "object", "properties": {"name": {"const": fn.get("name")}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    if not options:
        raise BadRequest(f"tool_choice names a function that is not in tools: {name}", param="tool_choice")
    return options[0] if len(options) == 1 else {"anyOf": options}


def avoiding(marker: str) -> str:
    """A regex of the strings that do not contain marker, for the two shapes of closing marker
    the dialects use: one whose first character occurs in it only once (after each run of that
    character, a proper prefix of the rest, then a character that breaks it), or a run of one
    character (Functionary's ">>>": shorter runs, each followed by another character)."""
    if marker and marker == marker[0] * len(marker):
        c, n = _rx(marker[0]), len(marker)
        return f"^(?:[^{c}]|{c}{{1,{n - 1}}}[^{c}])*{c}{{0,{n - 1}}}$" if n > 1 else f"^[^{c}]*$"
    if not marker or marker[0] in marker[1:]:
        raise ValueError(f"cannot exclude {marker!r}")
    c0 = _rx(marker[0])

    def rest(k: int) -> str:
        broken = f"[^{c0}{_rx(marker[k])}][^{c0}]*"
        return f"(?:{broken})?" if k == len(marker) - 1 else f"(?:{broken}|{_rx(marker[k])}{rest(k + 1)})?"
    return f"^[^{c0}]*(?:{c0}+{rest(1)})*$" if len(marker) > 1 else f"^[^{c0}]*$"


def _rx(ch: str) -> str:
    return f"\\x{{{ord(ch):x}}}"


_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def guarded(schema: object, avoid: str) -> object:
    """schema with every free string (one with no pattern, format, enum or const of its own)
    unable to contain `avoid`, so a call cannot be "closed" from inside an argument. JSON
    itself already keeps raw newlines and control characters out of strings."""
    if not avoid or not isinstance(schema, dict):
        return schema
    out = dict(schema)
    t = out.get("type")
    if (t == "string" or (isinstance(t, list) and "string" in t)) and \
            not any(k in out for k in ("pattern", "format", "enum", "const")):
        out["pattern"] = avoiding(avoid)
    for k in _SUBSCHEMAS:
        if isinstance(out.get(k), dict):
            out[k] = guarded(out[k], avoid)
    for k in _SCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [guarded(v, avoid) for v in out[k]]
    for k in _SCHEMA_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {n: guarded(v, avoid) for n, v in out[k].items()}
    return out


# A tool's schema constrains its calls as far as the engine can: keywords it does not implement
# (Claude Code's tools use propertyNames) are ignored, never a failed request. Only an
# explicit response_format (json_schema above) is refused for one.
TOOL_OPTIONS = {**JSON_OPTIONS, "lenient": True}


def json_rule(schema: object) -> str:
    """A lark rule body: one JSON value of a tool call that matches schema (leniently), laid
    out as JSON_OPTIONS says."""
    return (f"%json {{\"x-guidance\": {json.dumps(TOOL_OPTIONS)}, "
            f"\"allOf\": [{json.dumps(schema, separators=(',', ':'), ensure_ascii=False)}]}}")


def lit(text: str) -> str:
    """A lark string literal."""
    return json.dumps(text, ensure_ascii=False)


class SpecialTokens(Protocol):
    def special_id(self, text: str) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Thinking:
    """A reasoning block a forced call grammar lets the model write before its call: `open`,
    any text, `close`, then (with `gap`) optional whitespace. `inside`: the template's
    assistant opener already wrote `open`, so the reply starts in the block and must close it
    (DeepSeek R1's). Harmony's is its analysis message (the dialect's
    `reasoning_block`)."""
    open: str
    close: str
    inside: bool = False
    gap: bool = True


class Literals:
    """Text as a lark expression for one model's vocabulary: the one owner of "marker →
    grammar literal". A marker the vocabulary holds as one special token (Vocab.special_id:
    Qwen's <tool_call>, Llama 3's <|python_tag|>, Mistral's [TOOL_CALLS]) is that token, by id
    (`<[151657]>`): llguidance never matches a special token against quoted text, so a quoted
    marker would make the model spell it byte by byte. Everything else is a string literal.
    `free`: the special tokens a lazy grammar's free text may hold (the reasoning markers:
    free text is a lexeme, and a lexeme cannot hold a special token). `think`: the reasoning
    block a forced call may follow (None: the call from the first token; see `thinking`)."""

    def __init__(self, tokens: Mapping[str, int] | None = None, free: Iterable[int] = (),
                 think: Thinking | None = None):
        self.tokens = {m: t for m, t in (tokens or {}).items() if m}
        self.free = tuple(sorted(set(free)))
        self.think = think
        longest = sorted(self.tokens, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, longest)) + ")") if longest else None

    @classmethod
    def of(cls, vocab: SpecialTokens, markers: Iterable[str], free: Iterable[str] = ()) -> Literals:
        """The literals for `markers` (and the `free` ones, which free text may also hold) in
        `vocab`: each that is one special token there is that token, the rest text."""
        free = tuple(free)
        found = {m: vocab.special_id(m) for m in (*markers, *free) if m}
        tokens = {m: t for m, t in found.items() if t is not None}
        return cls(tokens, (tokens[m] for m in free if m in tokens))

    def thinking(self, think: Thinking | None) -> Literals:
        """These literals, with `think` as the reasoning block a forced call may follow."""
        return Literals(self.tokens, self.free, think)

    def token(self, text: str) -> int | None:
        """The special token `text` is (None: it is text)."""
        return self.tokens.get(text)

    def starts_special(self, text: str) -> bool:
        """`text` starts with a marker that is a special token."""
        return any(text.startswith(m) for m in self.tokens)

    def __call__(self, text: str) -> str:
        """A lark sequence that is `text` ("" for none): its markers as tokens, the rest quoted."""
        if self._split is None:
            return lit(text) if text else ""
        return " ".join(f"<[{self.tokens[p]}]>" if p in self.tokens else lit(p) for p in self._split.split(text) if p)

    def any_free(self) -> str:
        """A lark expression for one of the `free` tokens."""
        return f"<[{','.join(map(str, self.free))}]>"


PLAIN = Literals()  # every marker as text (a vocabulary with no special markers, tests)


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
