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


def call_from(obj: object) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
        text = args
    elif isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return ToolCall(new_call_id(), obj["name"], text)


def parse_json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
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
