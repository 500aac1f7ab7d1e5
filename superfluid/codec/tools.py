"""Tool calls: the wire format a model's chat template uses, rendering tools and past calls
into the conversation, and parsing calls out of generated text as it streams.

Formats (chosen from the template's source):
- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen); the
  template renders `tools` itself.
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` to the end of the turn.
- llama3: the whole reply is one JSON object `{"name": ..., "parameters": {...}}`.
- generic: for templates with no tool support (SmolLM2's): the tools and the Hermes
  markers are explained in the system message, and calls are parsed as Hermes.
Other formats (e.g. templates with their own special-token grammars) are not supported;
their calls come back as text."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from ..errors import BadRequest
from ..request import CallDelta, ToolCall


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    open: str  # the marker before a call ("" for llama3: the reply itself)
    close: str  # the marker after it ("" : to the end of the reply)
    native: bool  # the template renders `tools` and `tool_calls` itself


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", True)
GENERIC = ToolFormat("generic", "<tool_call>", "</tool_call>", False)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "", True)
LLAMA3 = ToolFormat("llama3", "", "", True)


def detect(template_source: str) -> ToolFormat:
    if "<tool_call>" in template_source:
        return HERMES
    if "[TOOL_CALLS]" in template_source:
        return MISTRAL
    if "<|python_tag|>" in template_source or "ipython" in template_source:
        return LLAMA3
    return GENERIC


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _call_from(obj: object) -> ToolCall | None:
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


def _parse_json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


# -- rendering ----------------------------------------------------------------------------
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


def instructions(tools: list[dict], fmt: ToolFormat) -> str:
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return ("You can call these tools:\n<tools>\n" + lines + "\n</tools>\n"
            f"To call a tool, answer with exactly:\n{fmt.open}\n"
            '{"name": "<tool name>", "arguments": {<the arguments as JSON>}}\n' + fmt.close)


def _args_obj(arguments: str) -> object:
    parsed = _parse_json(arguments)
    return parsed if parsed is not None else arguments


def render(messages: list[dict], tools: list[dict] | None, fmt: ToolFormat) -> tuple[list[dict], dict]:
    """Messages (with assistant `tool_calls` and `tool` results) as the template gets them,
    and the extra template variables (`tools` for templates that render them)."""
    out: list[dict] = []
    for m in messages:
        calls = m.get("tool_calls") or []
        if m.get("role") == "assistant" and calls:
            if fmt.native:
                out.append({**m, "tool_calls": [
                    {**c, "function": {**c["function"], "arguments": _args_obj(c["function"]["arguments"])}}
                    for c in calls]})
            else:
                text = "\n".join(f"{fmt.open}\n" + json.dumps({"name": c["function"]["name"],
                                                               "arguments": _args_obj(c["function"]["arguments"])},
                                                              ensure_ascii=False) + f"\n{fmt.close}" for c in calls)
                content = (m.get("content") or "")
                out.append({"role": "assistant", "content": (content + "\n" if content else "") + text})
        elif m.get("role") == "tool" and not fmt.native:
            out.append({"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"})
        else:
            out.append(m)
    extra: dict = {}
    if tools:
        if fmt.native:
            extra["tools"] = tools
        else:
            note = instructions(tools, fmt)
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "content": (out[0].get("content") or "") + "\n\n" + note}
            else:
                out.insert(0, {"role": "system", "content": note})
    return out, extra


# -- parsing ------------------------------------------------------------------------------
# a call whose JSON starts with its name and then its arguments object streams the arguments
# as they are generated; any other shape is parsed whole when the call closes
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')


class _Value:
    """Where a JSON object that is being generated ends, scanned incrementally."""
    __slots__ = ("pos", "depth", "instr", "esc", "end")

    def __init__(self) -> None:
        self.pos, self.depth, self.instr, self.esc = 0, 0, False, False
        self.end: int | None = None

    def scan(self, s: str) -> int:
        """How much of s (the object's text so far) belongs to the object."""
        while self.end is None and self.pos < len(s):
            ch = s[self.pos]
            self.pos += 1
            if self.instr:
                if self.esc:
                    self.esc = False
                elif ch == "\\":
                    self.esc = True
                elif ch == '"':
                    self.instr = False
            elif ch == '"':
                self.instr = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.pos
        return self.end if self.end is not None else len(s)


class _Open:
    """The call being written: its number, id and name once known, its arguments' start in
    the body and how much of them was sent."""
    __slots__ = ("index", "id", "name", "args_at", "sent", "value")

    def __init__(self, index: int) -> None:
        self.index, self.id, self.name = index, new_call_id(), ""
        self.args_at, self.sent, self.value = -1, 0, _Value()


class ToolStream:
    """Splits generated text into content and tool-call pieces (codec's typed output) as it
    streams. Text that might be the start of a marker is held back; markup never reaches the
    content. A call's arguments stream as they are generated; a call that does not parse and
    whose name was not yet sent comes back as text; a call cut off at the end ends `cut`."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self._buf = ""
        self._inside = False
        self._call: _Open | None = None
        self._started = False  # llama3: we have seen the first non-space character
        self._whole = False  # llama3: the reply is a JSON object; hold it all
        self.cut = False
        self.calls = 0
        self._eat_newline = False  # the newline after a close marker is layout

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        self._buf += text
        if self._eat_newline and self._buf:
            self._eat_newline = False
            if self._buf.startswith("\n"):
                self._buf = self._buf[1:]
        if self.fmt.name == "llama3":
            return self._feed_whole()
        out: list[str] = []
        calls: list[CallDelta] = []
        while True:
            if not self._inside:
                i = self._buf.find(self.fmt.open)
                if i < 0:
                    keep = _partial_suffix(self._buf, self.fmt.open)
                    out.append(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                out.append(self._buf[:i])
                self._buf = self._buf[i + len(self.fmt.open):]
                self._inside = True
                self._call = _Open(self.calls)
            else:
                if not self.fmt.close:  # mistral: the calls run to the end of the reply
                    break
                j = self._buf.find(self.fmt.close)
                if j < 0:
                    calls += self._stream(self._buf)
                    break
                body, self._buf = self._buf[:j], self._buf[j + len(self.fmt.close):]
                self._inside = False
                closed = self._close(body)
                if closed is None:
                    out.append(self.fmt.open + body + self.fmt.close)
                    continue
                calls += closed
                if self._buf.startswith("\n"):
                    self._buf = self._buf[1:]
                elif not self._buf:
                    self._eat_newline = True
        return "".join(out), calls

    def _stream(self, body: str) -> list[CallDelta]:
        """The pieces of the open call that its body so far makes certain."""
        c = self._call
        assert c is not None
        out: list[CallDelta] = []
        if c.args_at < 0:
            m = _HEAD.match(body)
            if m is None:
                return out
            try:
                name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                return out
            c.name, c.args_at = name, m.end()
            self.calls += 1
            out.append(CallDelta(c.index, c.id, c.name))
        args = body[c.args_at:]
        end = c.value.scan(args)
        if end > c.sent:
            out.append(CallDelta(c.index, arguments=args[c.sent:end]))
            c.sent = end
        return out

    def _close(self, body: str) -> list[CallDelta] | None:
        """The rest of a call whose close marker came; None: it is not a call (text)."""
        c = self._call
        assert c is not None
        out = self._stream(body)
        self._call = None
        if c.args_at >= 0:  # announced: it ends here, whole or not
            done = c.value.end is not None and _parse_json(body.strip()) is not None
            out.append(CallDelta(c.index, end=True, cut=not done))
            return out
        call = _call_from(_parse_json(body.strip()))
        if call is None:
            return None
        self.calls += 1
        return [CallDelta(c.index, call.id, call.name, call.arguments, end=True)]

    def _feed_whole(self) -> tuple[str, list[CallDelta]]:
        if not self._started:
            stripped = self._buf.lstrip()
            if not stripped:
                return "", []
            self._started = True
            self._whole = stripped.startswith("{")
        if self._whole:
            return "", []
        out, self._buf = self._buf, ""
        return out, []

    def _whole_calls(self, calls: list[ToolCall]) -> list[CallDelta]:
        out = [CallDelta(self.calls + k, c.id, c.name, c.arguments, end=True) for k, c in enumerate(calls)]
        self.calls += len(calls)
        return out

    def finish(self) -> tuple[str, list[CallDelta]]:
        """At the end of the reply: what was held back, and calls that end with it."""
        buf, self._buf = self._buf, ""
        if self.fmt.name == "llama3":
            if self._whole:
                call = _call_from(_parse_json(buf.strip()))
                if call is not None:
                    return "", self._whole_calls([call])
            return buf, []
        if not self._inside:
            return buf, []
        self._inside = False
        if self.fmt.name == "mistral":
            parsed = _parse_json(buf.strip())
            items = parsed if isinstance(parsed, list) else [parsed]
            calls = [c for c in map(_call_from, items) if c is not None]
            if calls and len(calls) == len(items):
                return "", self._whole_calls(calls)
            return self.fmt.open + buf, []
        self.cut = True  # an unterminated call: never shown as text
        c, self._call = self._call, None
        if c is not None and c.args_at >= 0:
            return "", [CallDelta(c.index, end=True, cut=True)]
        return "", []


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
