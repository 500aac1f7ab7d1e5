"""Functionary v3.2 (meetkai): a reply is a sequence of messages, each `>>>RECIPIENT\\nBODY`;
recipient `all` is text for the user, any other is a call to that function with JSON
arguments. The assistant-turn opener already wrote the first `>>>`, so every reply is read
by this dialect, tools or not. The template lists the tools and renders past calls (with
arguments as a JSON string)."""

from __future__ import annotations

import re

from .. import grammar as gr
from ..tools import call_from, parse_json, partial_suffix
from .base import Dialect, Parser, Parts, calls_lark, one_of, tool_names

SEP = ">>>"
_PROSE = r"all\n(.|\n)*"  # a message to the user
_RECIPIENT = re.compile(r"[A-Za-z0-9_.\-]+")


class _Reader(Parser):
    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._state = "head"  # head: reading a recipient; text: to the user; call: arguments
        self._name = ""

    @property
    def inside(self) -> bool:
        return self._state != "text"

    @property
    def holding(self) -> bool:
        return self._state == "text" and bool(self._buf)

    def feed(self, text: str) -> Parts:
        self._buf += text
        parts = Parts()
        while True:
            if self._state == "head":
                i = self._buf.find("\n")
                if i < 0:
                    if _RECIPIENT.fullmatch(self._buf) or not self._buf:
                        break
                    self._state = "text"  # no recipient: plain text
                    continue
                name, self._buf = self._buf[:i].strip(), self._buf[i + 1:]
                if name == "all":
                    self._state = "text"
                elif _RECIPIENT.fullmatch(name):
                    self._state, self._name = "call", name
                else:
                    self._buf = name + "\n" + self._buf
                    self._state = "text"
                continue
            i = self._buf.find(SEP)
            if i < 0:
                if self._state == "text":
                    keep = partial_suffix(self._buf, SEP)
                    parts.content += self._buf[:len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep:]
                break
            body, self._buf = self._buf[:i], self._buf[i + len(SEP):]
            self._end(body, parts)
            self._state = "head"
        return parts

    def _end(self, body: str, parts: Parts) -> None:
        if self._state == "text":
            parts.content += body
            return
        call = call_from({"name": self._name, "arguments": parse_json(body.strip())})
        if call is None:
            parts.content += body  # not JSON arguments: shown as text
        else:
            parts.calls += self.whole([call])

    def finish(self) -> Parts:
        buf, self._buf = self._buf, ""
        parts = Parts()
        if self._state == "head":
            parts.content = buf if buf.strip() != "all" else ""
        else:
            self._end(buf, parts)
        self._state = "text"
        return parts


class Functionary(Dialect):
    name = "functionary"
    structured = True
    args_as_text = True

    def detect(self, source: str) -> bool:
        return ">>>all" in source

    def parser(self) -> Parser:
        return _Reader()

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        """The opener ends with ">>>": the reply starts at a recipient, a call's name or (lazy)
        `all` and text, which may end in ">>>" and calls. Every message after a call is another
        call. A call's arguments end at the next ">>>", so an argument string cannot hold it."""
        call, rules = one_of([f"{gr.lit(fn + chr(10))} {gr.json_rule(gr.guarded(params, SEP))}"
                              for fn, params in tool_names(tools, name)])
        return calls_lark(call, rules, opener="", again=SEP, trigger=SEP, text=_PROSE, bare=True,
                          parallel=parallel, lazy=lazy, lits=lits)


FUNCTIONARY = Functionary()
