"""Tool calls, the parts every dialect shares: the tools a request offers (validated), call
ids, reading a call object out of JSON, and the note that explains tools to a model whose
template does not list them. The dialects themselves (how each template family writes and
reads calls) are in codec/dialects/."""

from __future__ import annotations

import json
import secrets

from ..errors import BadRequest
from ..request import ToolCall


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


MAX_DEPTH = 64  # brackets a call may nest: a model means no deeper call, and readers recurse
READ_ERRORS = (ValueError, TypeError, SyntaxError, RecursionError, MemoryError)  # what a reader may raise


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether brackets outside quoted strings nest past `limit` in `text` (one pass, no
    recursion): every reader checks this before it parses what a model wrote."""
    depth, quote, escaped = 0, "", False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]})":
            depth -= 1
    return False


def call_from(obj: object) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    try:
        if isinstance(args, str):
            if too_deep(args):
                return None
            json.loads(args)  # arguments are JSON, or no call
            text = args
        elif isinstance(args, dict):
            text = json.dumps(args, ensure_ascii=False)
        else:
            return None
    except READ_ERRORS:
        return None
    return ToolCall(new_call_id(), obj["name"], text)


def parse_json(text: str) -> object:
    """What a model wrote as JSON, or None (not JSON, or nested past MAX_DEPTH)."""
    if too_deep(text):
        return None
    try:
        return json.loads(text)
    except READ_ERRORS:
        return None


def tool_list(tools: list[dict]) -> list[dict]:
    """OpenAI-shaped tools, validated: [{"type": "function", "function": {name, description, parameters}}]."""
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest("each tool needs type 'function' and a function.name", param=f"tools.{i}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise BadRequest("function.parameters must be a JSON schema object", param=f"tools.{i}")
        out.append({"type": "function", "function": {"name": fn["name"], "description": fn.get("description", ""),
                                                      "parameters": params}})
    return out


def instructions(tools: list[dict], open_: str, close: str, example: str = "") -> str:
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    example = example or f'{open_}\n{{"name": "<tool name>", "arguments": {{<the arguments as JSON>}}}}\n{close}'
    return ("You can call these tools:\n<tools>\n" + lines + "\n</tools>\n"
            f"To call a tool, answer with exactly:\n{example}")


# Example requests for `examples`: a small model whose training had no tool calls (SmolLM2-135M)
# follows the call syntax only once it has seen calls in the conversation, never from a note
# alone; the examples name no real question, only a tool and made-up values of its parameters
_ASKS = (("Call {name} with {args}.", " = "), ("Use {name}, {args}.", ": "), ("{name} for {args} please.", " "))
_VALUES = {"string": ("a1", "b22", "c333"), "integer": (1, 22, 333), "number": (1.5, 22.5, 333.5),
           "boolean": (True, False, True), "array": ([], [], []), "object": ({}, {}, {})}


# the key that marks a message a dialect added as an example: the session records its tokens
# inside the message before it (the system note), never as a message of the conversation
EXAMPLE = "_superfluid_example"


def examples(tools: list[dict], n: int = 3) -> list[tuple[str, dict]]:
    """`n` made-up requests and the calls that answer them, built from the tools' schemas
    alone (tool i % len(tools), its required parameters, example values by JSON type)."""
    out = []
    for i in range(n):
        fn = tools[i % len(tools)]["function"]
        params = fn.get("parameters") or {}
        props = params.get("properties")
        props = props if isinstance(props, dict) else {}
        required = params.get("required")
        args: dict = {}
        for key in [k for k in required if isinstance(k, str)] if isinstance(required, list) else list(props)[:1]:
            prop = props.get(key)
            prop = prop if isinstance(prop, dict) else {}
            kind = prop.get("type")
            kind = kind if isinstance(kind, str) else "string"
            enum = prop.get("enum")
            values = enum if isinstance(enum, list) and enum else _VALUES.get(kind, _VALUES["string"])
            args[key] = values[i % len(values)]
        ask, sep = _ASKS[i % len(_ASKS)]
        shown = ", ".join(k + sep + (v if isinstance(v, str) else json.dumps(v)) for k, v in args.items())
        ask = ask.format(name=fn["name"], args=shown or "no arguments")
        out.append((ask, {"name": fn["name"], "arguments": args}))
    return out


def args_obj(arguments: object) -> object:
    if not isinstance(arguments, str):
        return arguments
    parsed = parse_json(arguments)
    return parsed if parsed is not None else arguments


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
