"""GPT-OSS Harmony: a reply is a sequence of messages, each a header up to `<|message|>` and a
body up to `<|end|>` (or `<|call|>` / `<|return|>`, which end the turn). The header names the
channel and, for a call, the recipient:

    <|channel|>analysis<|message|>...thinking...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "X"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is 18 C.<|return|>

`analysis` is reasoning, a `to=functions.NAME` recipient is a call (in either place in the
header), `final` and recipient-less `commentary` are content. The channels are the reply's
own structure, so this reader runs on every reply and splits the reasoning itself."""

from __future__ import annotations

import re

from .. import grammar as gr
from ..tools import call_from, parse_json, partial_suffix
from .base import ANY_TEXT, Dialect, Parser, Parts, calls_lark, one_of, tool_names

CHANNEL, MESSAGE, START, END = "<|channel|>", "<|message|>", "<|start|>", "<|end|>"
CALL, RETURN, CONSTRAIN = "<|call|>", "<|return|>", "<|constrain|>"
_ENDS = (END, CALL, RETURN, START)
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


class _Reader(Parser):
    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._state = "head"  # head | text | reasoning | call
        self._name = ""

    @property
    def inside(self) -> bool:
        return self._state != "text"

    @property
    def holding(self) -> bool:
        return self._state == "text" and bool(self._buf)

    def _header(self, head: str) -> None:
        channel = _CHANNEL.search(head)
        to = _RECIPIENT.search(head)
        if to and to.group(1).startswith("functions."):
            self._state, self._name = "call", to.group(1)[len("functions."):]
        elif channel and channel.group(1) == "analysis":
            self._state = "reasoning"
        else:
            self._state = "text"

    def feed(self, text: str) -> Parts:
        self._buf += text
        parts = Parts()
        while True:
            if self._state == "head":
                i = self._buf.find(MESSAGE)
                if i >= 0:
                    head, self._buf = self._buf[:i], self._buf[i + len(MESSAGE):]
                    self._header(head)
                    continue
                lead = self._buf.lstrip()
                if lead and not any(m.startswith(lead[:len(m)]) for m in (CHANNEL, START, "to=", END)) \
                        and START not in lead and CHANNEL not in lead:
                    self._state = "text"  # no header at all: plain text
                    continue
                break
            ends = [(j, m) for m in _ENDS if (j := self._buf.find(m)) >= 0]
            if not ends:
                if self._state != "call":
                    keep = max(partial_suffix(self._buf, m) for m in _ENDS)
                    self._emit(self._buf[:len(self._buf) - keep], parts)
                    self._buf = self._buf[len(self._buf) - keep:]
                break
            j, m = min(ends)
            body = self._buf[:j]
            self._buf = self._buf[j + (0 if m == START else len(m)):]
            self._end(body, parts)
            self._state = "head"
        return parts

    def _emit(self, text: str, parts: Parts) -> None:
        if self._state == "reasoning":
            parts.reasoning += text
        elif self._state == "text":
            parts.content += text

    def _end(self, body: str, parts: Parts) -> None:
        if self._state != "call":
            self._emit(body, parts)
            return
        call = call_from({"name": self._name, "arguments": parse_json(body.strip())})
        if call is None:
            self.cut = True  # arguments that are not JSON: the call is dropped, never shown
        else:
            parts.calls += self.whole([call])

    def finish(self) -> Parts:
        parts = Parts()
        buf, self._buf = self._buf, ""
        if self._state != "head":
            self._end(buf, parts)
        self._state = "text"
        return parts


OPENER = CHANNEL + "commentary to=functions."  # a call's header, up to the function's name
NEXT = END + START + "assistant"  # between two messages of one reply
SAYS = ("analysis", "final", "commentary")  # the channels of a message that is not a call


class Harmony(Dialect):
    name = "harmony"
    structured = True
    own_reasoning = True
    markers = (CHANNEL, MESSAGE, START, END, CALL, RETURN, CONSTRAIN)
    reasoning_block = gr.Thinking(CHANNEL + "analysis" + MESSAGE, NEXT, gap=False)  # the analysis message

    def detect(self, source: str) -> bool:
        return CHANNEL in source

    def parser(self) -> Parser:
        return _Reader()

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        """One call whatever `parallel` says: a Harmony call ends the turn (`<|call|>` is a stop
        token, and the template renders one call per assistant message). Every marker that ends
        a message starts with "<|", so an argument string cannot hold "<|". Forced, the analysis
        message may come first (`lits.think`, from `reasoning_block`).

        Lazy (tool_choice auto): messages in any channel but a call's (`analysis`, `final`,
        `commentary`), each ended by `<|end|><|start|>assistant` before the next, until one is
        opened as a call (`<|channel|>commentary to=functions.NAME`), which is then the
        reply's last. The markers are special tokens in gpt-oss's vocabulary, which a text
        lexeme cannot hold, so the messages are spelled out here token by token. Where they
        are text (--tool-dialect on another family's model) the free text runs to
        `<|start|>assistant<|channel|>commentary to=functions.`, or the reply opens with a call."""
        call, rules = one_of([f"{lits(fn + ' ' + CONSTRAIN + 'json' + MESSAGE)} {gr.json_rule(gr.guarded(p, '<|'))}"
                              for fn, p in tool_names(tools, name)])
        if not lazy or lits.token(CHANNEL) is None:
            return calls_lark(call, rules, opener=OPENER, again="", trigger=START + "assistant" + OPENER,
                              bare=True, parallel=False, lazy=lazy, lits=lits)
        says = " | ".join(map(gr.lit, SAYS))
        return gr.lark(f"start: (say next)* (say | {lits(OPENER)} calls)\nnext: {lits(NEXT)}\n"
                       f"say: {lits(CHANNEL)} ({says}) {lits(MESSAGE)} TEXT\nTEXT: /{ANY_TEXT}/\n"
                       f"calls: {call}\n{rules}\n")


HARMONY = Harmony()
