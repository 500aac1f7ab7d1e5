"""Gemma (2 and 3): the template knows no tools and no system turn, and turns must alternate.
Calls are Python in a `tool_code` block, results come back in a `tool_output` block:

    ```tool_code
    get_weather(city="Paris")
    ```

The tools and the syntax are explained at the top of the first user turn (with the system
message, which Gemma's template refuses as a turn of its own); calls and results are written
into the conversation as text, and turns of one role that follow each other are joined."""

from __future__ import annotations

import ast
import json

from ...request import ToolCall
from .. import grammar as gr
from ..tools import READ_ERRORS, args_obj, new_call_id, too_deep
from .base import Delimited, Dialect, Parser, calls_lark, tool_names

OPEN, CLOSE = "```tool_code\n", "\n```"
_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> object:
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    return ast.literal_eval(node)


def read_python(body: str) -> list[ToolCall] | None:
    """Calls `name(key=value, ...)` (one a line; `print(...)` around one is allowed)."""
    if too_deep(body):
        return None
    try:
        tree = ast.parse(body.strip(), mode="exec")
    except READ_ERRORS:
        return None
    calls = []
    for stmt in tree.body:
        node = stmt.value if isinstance(stmt, ast.Expr) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print" \
                and len(node.args) == 1 and isinstance(node.args[0], ast.Call):
            node = node.args[0]
        if not isinstance(node, ast.Call) or node.args:
            return None
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else (
            fn.attr if isinstance(fn, ast.Attribute) else None)
        if name is None:
            return None
        try:
            args = {k.arg: _literal(k.value) for k in node.keywords if k.arg is not None}
        except READ_ERRORS:
            return None
        calls.append(ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False)))
    return calls or None


def _py(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


class Gemma(Dialect):
    name = "gemma"
    native = False
    native_calls = False

    def detect(self, source: str) -> bool:
        return "<start_of_turn>" in source

    def parser(self) -> Parser:
        return Delimited(OPEN, CLOSE, read_python)

    def note(self, tools: list[dict]) -> str:
        lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
        return ("You have access to functions. If you decide to invoke any of the function(s), you MUST put it "
                "in the format of\n```tool_code\nfunction_name(param_name=value)\n```\nYou SHOULD NOT include any "
                "other text in the response if you call a function.\nThe functions:\n" + lines)

    def call_text(self, calls: list[dict]) -> str:
        lines = []
        for c in calls:
            args = args_obj(c["function"]["arguments"])
            kw = ", ".join(f"{k}={_py(v)}" for k, v in args.items()) if isinstance(args, dict) else ""
            lines.append(f"{c['function']['name']}({kw})")
        return OPEN + "\n".join(lines) + CLOSE

    def tool_result(self, message: dict) -> dict:
        return {"role": "user", "content": f"```tool_output\n{message.get('content') or ''}\n```"}

    def render(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], dict]:
        out, extra = super().render(messages, tools)
        system = [m.get("content") or "" for m in out if m.get("role") == "system"]
        turns: list[dict] = []
        for m in out:
            if m.get("role") == "system":
                continue
            if turns and turns[-1]["role"] == m.get("role"):
                joined = (turns[-1].get("content") or "") + "\n\n" + (m.get("content") or "")
                turns[-1] = {**turns[-1], "content": joined}
            else:
                turns.append({**m, "content": m.get("content") or ""})
        if system:
            head = "\n\n".join(system)
            if turns and turns[0]["role"] == "user":
                turns[0] = {**turns[0], "content": head + "\n\n" + turns[0]["content"]}
            else:
                turns.insert(0, {"role": "user", "content": head})
        return turns, extra

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        """Calls one a line in one tool_code block. Values are JSON, which holds no raw newline,
        so no value can hold the block's closing marker ("\\n```")."""
        rules, alts = [], []
        for i, (fn, params) in enumerate(tool_names(tools, name)):
            kws = []
            for j, (p, schema) in enumerate((params.get("properties") or {}).items()):
                rules.append(f"k{i}_{j}: {gr.lit(p + '=')} {gr.json_rule(schema)}")
                kws.append(f"k{i}_{j}")
            kw = " | ".join(kws)
            args = f"(({kw}) (\", \" ({kw}))*)?" if kws else ""
            rules.append(f"c{i}: {gr.lit(fn + '(')} {args} \")\"")
            alts.append(f"c{i}")
        return calls_lark(f"({' | '.join(alts)})", "\n".join(rules), opener=OPEN, again="\n", closer=CLOSE,
                          parallel=parallel, lazy=lazy, lits=lits)


GEMMA = Gemma()
