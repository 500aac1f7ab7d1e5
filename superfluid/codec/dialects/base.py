"""A tool-call dialect: how one family of chat templates writes the tools, a model's calls and
their results, and how a reply in that family is read back as it streams.

Every dialect gives:
- `detect(template_source)`: whether a template is of this family (codec/dialects/__init__.py
  tries them in order, as llama.cpp's chat parser does);
- `render(messages, tools)`: the conversation as the template wants it (tool calls, tool
  results and, for templates that do not list tools themselves, a system note);
- `parser()`: an incremental reader of one reply: text in, content / reasoning / tool-call
  pieces (request.CallDelta) out, whatever the pieces the text arrives in;
- `calls_grammar(tools, name, parallel=, lazy=, lits=)`: an llguidance grammar for calls in the
  dialect's own syntax, built by `calls_lark`: calls from the first token (tool_choice
  "required" or a named function) or lazy (tool_choice "auto": free text until the call-opening
  marker), one call or with `parallel` one or more; `grammar(tools, name)` is exactly one;
- `markers`: special tokens the reader must see as text (they are detokenized as their names);
- `structured`: the reader runs on every reply, tools or not (the reply's markup is the
  dialect's: Harmony channels, Functionary recipients, Granite's <response>)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import BadRequest
from ...request import CallDelta, ToolCall
from .. import grammar as gr
from ..tools import args_obj, call_from, instructions, new_call_id, parse_json, partial_suffix


@dataclass
class Parts:
    content: str = ""
    reasoning: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def add(self, other: Parts) -> None:
        self.content += other.content
        self.reasoning += other.reasoning
        self.calls += other.calls


class Parser:
    """Reads one reply as it streams. `inside`: the text now is markup or a call (not content);
    `holding`: text is held back because it may start a marker; `calls`: calls started;
    `cut`: a call was left open when the reply ended."""

    def __init__(self) -> None:
        self.calls = 0
        self.cut = False

    @property
    def inside(self) -> bool:
        return False

    @property
    def holding(self) -> bool:
        return False

    def feed(self, text: str) -> Parts:
        raise NotImplementedError

    def finish(self) -> Parts:
        raise NotImplementedError

    def whole(self, calls: list[ToolCall]) -> list[CallDelta]:
        """Deltas for calls read whole: each starts and ends in one piece."""
        out = [CallDelta(self.calls + k, c.id, c.name, c.arguments, end=True) for k, c in enumerate(calls)]
        self.calls += len(calls)
        return out


Reader = Callable[[str], "list[ToolCall] | None"]  # a call block's body -> its calls (None: not calls)


class Delimited(Parser):
    """Calls between an open and a close marker (close "": to the end of the reply), read whole
    when the block ends. A block that does not read as calls comes back as text. `strip`:
    markup that is dropped from the content (Granite's <response> tags)."""

    def __init__(self, open_: str, close: str, read: Reader, strip: tuple[str, ...] = ()):
        super().__init__()
        self.open, self.close, self.read, self.strip = open_, close, read, strip
        self._buf = ""
        self._inside = False

    @property
    def inside(self) -> bool:
        return self._inside

    @property
    def holding(self) -> bool:
        return not self._inside and bool(self._buf)

    def _content(self, text: str) -> str:
        for s in self.strip:
            text = text.replace(s, "")
        return text

    def feed(self, text: str) -> Parts:
        self._buf += text
        out: list[str] = []
        parts = Parts()
        while True:
            if not self._inside:
                i = self._buf.find(self.open)
                if i < 0:
                    keep = max(partial_suffix(self._buf, m) for m in (self.open, *self.strip))
                    out.append(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                out.append(self._buf[:i])
                self._buf = self._buf[i + len(self.open):]
                self._inside = True
            else:
                j = self._buf.find(self.close) if self.close else -1
                if j < 0:
                    break
                body, self._buf = self._buf[:j], self._buf[j + len(self.close):]
                self._inside = False
                calls = self.read(body)
                if calls is None:
                    out.append(self.open + body + self.close)
                else:
                    parts.calls += self.whole(calls)
                    self._buf = self._buf.removeprefix("\n")
        parts.content = self._content("".join(out))
        return parts

    def finish(self) -> Parts:
        buf, self._buf = self._buf, ""
        if not self._inside:
            return Parts(self._content(buf))
        self._inside = False
        calls = self.read(buf)  # a block the reply ended in (its close marker may be the end of turn)
        if calls is not None:
            return Parts(calls=self.whole(calls))
        if self.close:
            self.cut = True  # an unterminated call: never shown as text
            return Parts()
        return Parts(self._content(self.open + buf))


def json_calls(body: str) -> list[ToolCall] | None:
    """A JSON call object or a list of them ({"name": ..., "arguments" | "parameters": ...})."""
    parsed = parse_json(body.strip())
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = [c for c in map(call_from, items) if c is not None]
    return calls if calls and len(calls) == len(items) else None


class Dialect:
    """The default: a template that renders `tools` and assistant `tool_calls` itself, with
    arguments as objects."""
    name = ""
    native = True  # the template lists the tools itself
    structured = False  # the reader runs on every reply, with tools or without
    own_reasoning = False  # the reader splits the reasoning itself (no <think> markers)
    markers: tuple[str, ...] = ()
    args_as_text = False  # the template wants a call's arguments as a JSON string
    reasoning_block: gr.Thinking | None = None  # its own reasoning markup (Harmony's analysis message)

    def __repr__(self) -> str:
        return f"<dialect {self.name}>"

    def detect(self, source: str) -> bool:
        return False

    def parser(self) -> Parser:
        raise NotImplementedError

    def grammar(self, tools: list[dict], name: str | None, lits: gr.Literals = gr.PLAIN) -> str:
        """Exactly one call, from the first token."""
        return self.calls_grammar(tools, name, parallel=False, lazy=False, lits=lits)

    def calls_grammar(self, tools: list[dict], name: str | None, *, parallel: bool, lazy: bool,
                      lits: gr.Literals = gr.PLAIN) -> str:
        """The grammar for a turn with tools: `lazy` (tool_choice auto) free text that turns into
        calls at the dialect's call-opening marker, otherwise calls from the first token;
        `parallel`: one or more calls, else exactly one. A dialect that cannot be lazy returns ""
        for `lazy` (an unconstrained auto turn). Argument strings never hold the marker that
        ends a call (the reader would end the call there). `lits` writes every piece of text
        that may hold a marker (grammar.Literals: the marker as the model's special token when
        its vocabulary has one)."""
        raise NotImplementedError

    # -- rendering ----------------------------------------------------------------------
    def call_text(self, calls: list[dict]) -> str:
        """Calls written out in the dialect's syntax, for templates that do not render them."""
        raise NotImplementedError

    def tool_result(self, message: dict) -> dict:
        """A tool result as the template takes it (default: a `tool` turn as it is)."""
        return message

    def note(self, tools: list[dict]) -> str:
        """The system note that lists the tools, for templates that do not."""
        return instructions(tools, "<tool_call>", "</tool_call>")

    def render_call(self, message: dict, calls: list[dict]) -> dict:
        if not self.native_calls:
            content = message.get("content") or ""
            return {"role": "assistant", "content": (content + "\n" if content else "") + self.call_text(calls)}
        args = (lambda a: a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)) if self.args_as_text \
            else args_obj
        return {**message, "content": message.get("content") or "",
                "tool_calls": [{**c, "function": {**c["function"], "arguments": args(c["function"]["arguments"])}}
                               for c in calls]}

    native_calls = True  # the template renders assistant `tool_calls`

    def render(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], dict]:
        """Messages as the template gets them, and the extra template variables."""
        out: list[dict] = []
        for m in messages:
            calls = m.get("tool_calls") or []
            if m.get("role") == "assistant" and calls:
                out.append(self.render_call(m, calls))
            elif m.get("role") == "tool":
                out.append(self.tool_result(m))
            else:
                out.append(m)
        extra: dict = {}
        if tools:
            if self.native:
                extra["tools"] = tools
            else:
                out = with_system_note(out, self.note(tools))
        return out, extra


def with_system_note(messages: list[dict], note: str) -> list[dict]:
    out = list(messages)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": (out[0].get("content") or "") + "\n\n" + note}
    else:
        out.insert(0, {"role": "system", "content": note})
    return out


def tool_names(tools: list[dict], name: str | None) -> list[tuple[str, dict]]:
    """(name, parameters schema) of the tools a forced call may use."""
    out = [(t["function"]["name"], t["function"].get("parameters") or {"type": "object"}) for t in tools
           if name is None or t["function"]["name"] == name]
    if not out:
        raise BadRequest(f"tool_choice names a function that is not in tools: {name}", param="tool_choice")
    return out


ANY_TEXT = r"(.|\n)*"


def calls_lark(call: str, rules: str, *, opener: str, again: str, closer: str = "", tail: str = "",
               trigger: str | None = None, text: str = ANY_TEXT, bare: bool = False, alone: str = "",
               parallel: bool, lazy: bool, lits: gr.Literals = gr.PLAIN) -> str:
    """Every dialect's call grammar: `opener call (again call)* closer tail?`, where `call` is a
    lark expression over `rules` (one call) and the repetition is there only with `parallel`
    (otherwise exactly one call). `tail`: layout the model may write after the calls (a
    separator written in expectation of another call does not force one). `lits`: how the
    model's vocabulary holds the markers (as special tokens or as text).

    `lazy` (tool_choice auto): any text (the regex `text`), which may end in `trigger` (default:
    the opener without its trailing whitespace); from the trigger on, the rest of the opener
    and the calls are enforced, and after them the reply ends. A trigger that is text ends a
    lazy lexeme; one that is a special token follows the free text (which cannot hold it), as
    may the reasoning markers (`lits.free`). `bare`: the calls may also start the reply with
    the opener and no trigger (Llama 3's bare JSON, Functionary's recipient). `alone`: a lark
    expression for a call that may follow the trigger instead of the calls, by itself (Llama
    3's built-in tools after <|python_tag|>); forced, the trigger may then open the reply.

    Forced, the reasoning block `lits.think` (grammar.Thinking) may come first, or must where
    the opener already opened it: a thinking model reasons, then calls."""
    more = f"({_seq(lits(again), call)})*" if parallel else ""
    calls = _seq(call, more, lits(closer), f"({lits(tail)})?" if tail else "")
    body = f"calls: {calls}\n{rules}\n"
    trigger = opener.rstrip() if trigger is None else trigger
    called = f"(calls | {alone})" if alone else "calls"  # what follows the trigger
    if not lazy:
        think, think_rules = _thinking(lits)
        forced = _seq(lits(opener), "calls") + (f" | {_seq(lits(trigger), called)}" if alone else "")
        return gr.lark(f"start: {_seq(think, f'({forced})' if alone and think else forced)}\n{think_rules}{body}")
    if not trigger:
        raise ValueError("a lazy call grammar needs a call-opening marker")
    at = opener.find(trigger)
    # the opener's rest after the trigger (none for a trigger that ends with the whole opener)
    after = opener[at + len(trigger):] if at >= 0 else ("" if trigger.endswith(opener) else opener)
    tok = lits.token(trigger)
    head = f"head: TEXT <[{tok}]>" if tok is not None else f"head[lazy]: TEXT {gr.lit(trigger)}"
    alts = ["TEXT", _seq("head", lits(after), called)] + ([_seq(lits(opener), "calls")] if bare else [])
    start = f"free ({' | '.join(alts)})\nfree: (TEXT {lits.any_free()})*" if lits.free else " | ".join(alts)
    return gr.lark(f"start: {start}\n{head}\nTEXT: /{text}/\n{body}")


def _thinking(lits: gr.Literals) -> tuple[str, str]:
    """The reasoning block before a forced call: the lark expression ("" for none) and its
    rules. Its text ends at the close marker: a special token ends the text lexeme, a marker
    that is text ends a lazy one (at its first occurrence)."""
    t = lits.think
    if t is None:
        return "", ""
    if lits.starts_special(t.close):
        rules, text = "", f"THINK_TEXT {lits(t.close)}"
    else:
        rules, text = f"think_text[lazy]: THINK_TEXT {gr.lit(t.close)}\n", "think_text"
    gap = "GAP?" if t.gap else ""
    rules = (f"think: {_seq('' if t.inside else lits(t.open), text, gap)}\n{rules}THINK_TEXT: /{ANY_TEXT}/\n"
             + ("GAP: /[ \\t\\r\\n]+/\n" if t.gap else ""))
    return ("think" if t.inside else "think?"), rules


def one_of(bodies: list[str], prefix: str = "c") -> tuple[str, str]:
    """A lark choice between rule bodies (one per tool): the expression and its rules."""
    names = [f"{prefix}{i}" for i in range(len(bodies))]
    return f"({' | '.join(names)})", "\n".join(f"{n}: {b}" for n, b in zip(names, bodies, strict=True))


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


__all__ = ["ANY_TEXT", "Delimited", "Dialect", "Parser", "Parts", "calls_lark", "json_calls", "new_call_id", "one_of",
           "tool_names", "with_system_note"]
