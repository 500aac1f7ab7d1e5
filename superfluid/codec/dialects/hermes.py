"""Hermes / Qwen 2.5 / Qwen 3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
the template lists the tools and renders past calls itself. `generic` is the same syntax for
templates with no tool support at all (SmolLM2's ChatML): the tools and the markers are
explained in a system note, calls and results are written into the conversation as text.

A call whose JSON starts with its name and then its arguments object streams the arguments
as they are generated; any other shape is read whole when the call closes."""

from __future__ import annotations

import json
import re

from ...request import CallDelta
from .. import grammar as gr
from ..tools import EXAMPLE, args_obj, call_from, examples, new_call_id, parse_json, partial_suffix
from .base import Dialect, Parser, Parts, calls_lark

CLOSE = "\n</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')


class _Value:
    """Where a JSON value that is being generated ends, scanned incrementally."""
    __slots__ = ("pos", "depth", "instr", "esc", "end")

    def __init__(self) -> None:
        self.pos, self.depth, self.instr, self.esc = 0, 0, False, False
        self.end: int | None = None

    def scan(self, s: str) -> int:
        """How much of s (the value's text so far) belongs to the value."""
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
    """The call being written: its number, id and name once known, where its arguments start
    in the body and how much of them was sent."""
    __slots__ = ("index", "id", "name", "args_at", "sent", "value")

    def __init__(self, index: int) -> None:
        self.index, self.id, self.name = index, new_call_id(), ""
        self.args_at, self.sent, self.value = -1, 0, _Value()


class ToolStream(Parser):
    """JSON calls between an open and a close marker. Text that might start a marker is held
    back; markup never reaches the content. A call that does not parse and whose name was
    not yet sent comes back as text; a call cut off at the end ends `cut`."""

    def __init__(self, open_: str = "<tool_call>", close: str = "</tool_call>"):
        super().__init__()
        self.open, self.close = open_, close
        self._buf = ""
        self._inside = False
        self._call: _Open | None = None
        self._eat_newline = False  # the newline after a close marker is layout

    @property
    def inside(self) -> bool:
        return self._inside

    @property
    def holding(self) -> bool:
        return not self._inside and bool(self._buf)

    def feed(self, text: str) -> Parts:
        self._buf += text
        if self._eat_newline and self._buf:
            self._eat_newline = False
            self._buf = self._buf.removeprefix("\n")
        out: list[str] = []
        calls: list[CallDelta] = []
        while True:
            if not self._inside:
                i = self._buf.find(self.open)
                if i < 0:
                    keep = partial_suffix(self._buf, self.open)
                    out.append(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                out.append(self._buf[:i])
                self._buf = self._buf[i + len(self.open):]
                self._inside = True
                self._call = _Open(self.calls)
            else:
                j = self._buf.find(self.close)
                if j < 0:
                    calls += self._stream(self._buf)
                    break
                body, self._buf = self._buf[:j], self._buf[j + len(self.close):]
                self._inside = False
                closed = self._close(body)
                if closed is None:
                    out.append(self.open + body + self.close)
                    continue
                calls += closed
                if self._buf.startswith("\n"):
                    self._buf = self._buf[1:]
                elif not self._buf:
                    self._eat_newline = True
        return Parts("".join(out), calls=calls)

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
            done = c.value.end is not None and parse_json(body.strip()) is not None
            out.append(CallDelta(c.index, end=True, cut=not done))
            return out
        call = call_from(parse_json(body.strip()))
        if call is None:
            return None
        self.calls += 1
        return [CallDelta(c.index, call.id, call.name, call.arguments, end=True)]

    def finish(self) -> Parts:
        """At the end of the reply: what was held back, and a call that ends with it."""
        buf, self._buf = self._buf, ""
        if not self._inside:
            return Parts(buf)
        self._inside = False
        self.cut = True  # an unterminated call: never shown as text
        c, self._call = self._call, None
        if c is not None and c.args_at >= 0:
            return Parts(calls=[CallDelta(c.index, end=True, cut=True)])
        return Parts()


class Hermes(Dialect):
    name = "hermes"
    markers = ("<tool_call>", "</tool_call>")

    def detect(self, source: str) -> bool:
        return "<tool_call>" in source

    def parser(self) -> Parser:
        return ToolStream()

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        # an argument string cannot hold "</tool_call>": the call cannot be closed from inside it
        body = gr.json_rule(gr.call_schema(tools, name, avoid="</tool_call>"))
        return calls_lark(f"body {lits(CLOSE)}", f"body: {body}", opener="<tool_call>\n",
                          again="\n<tool_call>\n", tail="\n", parallel=parallel, lazy=lazy, lits=lits)

    def call_text(self, calls: list[dict]) -> str:
        return "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                       "arguments": args_obj(c["function"]["arguments"])},
                                                      ensure_ascii=False) + "\n</tool_call>" for c in calls)


class Generic(Hermes):
    """Hermes markers on a template that knows nothing of tools."""
    name = "generic"
    native = False
    native_calls = False

    def detect(self, source: str) -> bool:
        return True

    def tool_result(self, message: dict) -> dict:
        return {"role": "user", "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"}

    def render(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], dict]:
        """As Hermes, plus example exchanges after the system note (codec/tools.examples) while
        the conversation has no call of its own: a model never taught tool calls writes one
        only after seeing calls in the conversation (once it has its own call and result, the
        examples made SmolLM2 echo the result's markup instead of answering)."""
        out, extra = super().render(messages, tools)
        if tools and not any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            shots: list[dict] = []
            for ask, call in examples(tools):  # EXAMPLE: prompt text, not the conversation's messages
                shots += [{"role": "user", "content": ask, EXAMPLE: True},
                          {"role": "assistant", "content": self.call_text([{"function": call}]), EXAMPLE: True}]
            out[1:1] = shots
        return out, extra


HERMES = Hermes()
GENERIC = Generic()
