"""Token spans for a session's turns, from the model's own chat template.

A chat template renders a whole conversation; a session needs each message's tokens on
their own. A new message's span is the text the template renders after what the model has
already seen (the session's context, detokenized with its special tokens), so a cut
assistant turn is closed the way the template closes it. When a template renders earlier
turns differently once a message is added (some drop old reasoning), the span falls back to
the difference between the two renderings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from .events import GenerationPrompt, Message
from .markup import encode, mark_kwargs, mark_message, unmark
from .markup import typed_markers as _typed_markers


def encode_turn(tok, text: str, content: str | None, first: bool, at: int | None = None) -> list[int]:
    """Tokens of rendered conversation text holding one message's content: the template's
    markup with its special tokens parsed, the content as plain text, so chat markers a user
    typed stay text. `at`: where the content starts in `text` (default: its last occurrence).
    Text with no such content is tokenized whole, as before. Content holding such markers that
    the text does not hold verbatim is refused: it cannot be told from the template's markup
    (`Turns` passes the content as the template shows it, trimmed or escaped)."""
    if not content or not _typed_markers(tok, content):
        return encode(tok, text, True, first)
    i = text.rfind(content) if at is None else at
    if i < 0 or text[i:i + len(content)] != content:
        i = text.rfind(content)
    if i < 0:
        raise _unplaceable()
    head, tail = text[:i], text[i + len(content):]
    return encode(tok, head, True, first) + encode(tok, content, False) + encode(tok, tail, True)


def _unplaceable() -> BadRequest:
    return BadRequest("a message holds text this model reads as chat markup (special tokens), and its chat template "
                      "rewrites that message so the text cannot be kept apart from the markup", param="messages")


SENTINEL = "\x00superfluid-content\x00"


def shown_content(render, before: list[dict], msg: dict, full: str) -> str:
    """A message's content as the template puts it in `full` (the rendering of `before` and
    `msg`): the content itself when `full` holds it verbatim; else what stands where a
    sentinel content stands when rendered the same way (templates that trim the content, as
    Llama 3's and Gemma's do). Refused when the template does something else with it."""
    content = msg["content"]
    if content in full:
        return content
    marked = render(before + [{**msg, "content": SENTINEL}])
    j = marked.find(SENTINEL)
    head, tail = marked[:j], marked[j + len(SENTINEL):]
    if j < 0 or SENTINEL in tail or len(head) + len(tail) > len(full) \
            or not full.startswith(head) or not full.endswith(tail):
        raise _unplaceable()
    return full[len(head):len(full) - len(tail)]


def context_text(tokenizer, tokens: list[int]) -> str:
    return b"".join(tokenizer.token_text(t) for t in tokens).decode("utf-8", "replace")


@dataclass
class Turns:
    """A growing conversation: its rendered messages, tokens and their text."""
    tokenizer: Any
    template: Any
    template_kwargs: dict = field(default_factory=dict)
    messages: list[dict] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""

    @classmethod
    def of(cls, engine, state=None, **template_kwargs) -> Turns:
        tok = engine.tokenizer
        t = cls(tok, engine.template, mark_kwargs(tok, template_kwargs))
        if state is not None:
            t.messages = [mark_message(tok, m, content=True) for m in state.conversation(tok.decode)]
            t.tokens = list(state.tokens)
            t.text = context_text(engine.tokenizer, t.tokens)
        return t

    def _render(self, messages: list[dict], gen: bool) -> str:
        return self.template.render(messages, add_generation_prompt=gen, **self.template_kwargs)

    def _span(self, full: str, previous: list[dict], content: str | None = None) -> tuple[int, ...]:
        tok = self.tokenizer
        if not self.tokens:
            return tuple(encode_turn(tok, full, content, True))
        if full.startswith(self.text):
            rest = full[len(self.text):]
        else:
            prev = self._render(previous, False) if previous else ""
            if not full.startswith(prev):
                # the template renders an earlier turn anew (gpt-oss closes a last assistant
                # message `<|return|>`, an earlier one `<|end|>`): what is new is what follows
                # the tokens both renderings share; the session keeps what it has
                a, b = encode(tok, prev, True, False), encode(tok, full, True, False)
                same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                return tuple(b[same:])
            rest = full[len(prev):]
        return tuple(encode_turn(tok, rest, content, False))

    def _take(self, span: tuple[int, ...]) -> None:
        self.tokens.extend(span)
        self.text += context_text(self.tokenizer, list(span))

    def message(self, msg: dict) -> Message:
        """The event for a new message; the conversation grows by it."""
        if msg.get("role") == "prompt":  # a raw completion prompt: no template
            text = str(msg.get("content") or "")
            enc = self.tokenizer.encode_prompt if not self.tokens else (
                lambda s: self.tokenizer.encode(s, parse_special=True))
            span = tuple(enc(text))
        else:
            msg = mark_message(self.tokenizer, msg)  # every string but the content (markup.py)
            full = self._render(self.messages + [msg], False)
            content = msg.get("content")
            if isinstance(content, str) and content and _typed_markers(self.tokenizer, content):
                content = shown_content(lambda ms: self._render(ms, False), self.messages, msg, full)
            span = self._span(full, self.messages, content if isinstance(content, str) else None)
            self.messages.append(mark_message(self.tokenizer, msg, content=True))
        self._take(span)
        return Message(str(msg.get("role")), unmark(_text(msg.get("content"))), span)

    def opener(self) -> GenerationPrompt:
        """The assistant-turn opener the template puts before a reply."""
        if not self.messages:
            raise BadRequest("the session has no messages to reply to", param="messages")
        full = self._render(self.messages, True)
        span = self._span(full, self.messages)
        self._take(span)
        return GenerationPrompt(span)


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    return str(content)


def prelude(engine, messages: list[dict], **template_kwargs) -> tuple[list, list[int]]:
    """A chat request's events (one Message per message, then the opener) and its prompt,
    which is exactly the concatenation of their spans."""
    tok = engine.tokenizer
    messages = [mark_message(tok, m) for m in messages]  # every string but the contents (markup.py)
    template_kwargs = mark_kwargs(tok, template_kwargs)
    fast = _prelude_light(engine, messages, template_kwargs)
    if fast is not None:
        return fast
    t = Turns.of(engine, **template_kwargs)
    bodies: list = [t.message(m) for m in messages]
    bodies.append(t.opener())
    return bodies, t.tokens


_MARK = re.compile("\x00(\\d+)\x00")
# Each message's span is what rendering the conversation up to it adds: one rendering per
# message. Up to EXACT messages that is cheap; past them the spans come from one rendering of
# the whole conversation, split where the next message's opening markup (learned from the
# exact ones) begins, so the cost grows linearly with the messages.
EXACT = 128
EXTRA_RENDERS = 64  # exact renderings spent on openings not seen among the first EXACT
SLOW_MAX = 512  # templates that re-render earlier turns: one full rendering per message


def _prelude_light(engine, messages: list[dict], kw: dict) -> tuple[list, list[int]] | None:
    """The same spans, rendering with short markers for the contents (an agent's 100-message
    history would otherwise be rendered 100 times in full). Valid only when the template puts
    contents in verbatim, which one full rendering checks; None otherwise."""
    contents: list[str | None] = [m.get("content") for m in messages]
    if not messages or not all(c is None or (isinstance(c, str) and "\x00" not in c) for c in contents):
        return _slow(messages, "unless every content is text")
    light = [m if c is None else {**m, "content": f"\x00{i}\x00"}
             for i, (m, c) in enumerate(zip(messages, contents, strict=True))]
    real = lambda text: _MARK.sub(lambda mm: contents[int(mm.group(1))] or "", text)  # noqa: E731
    render = lambda msgs, gen: engine.template.render(msgs, add_generation_prompt=gen, **kw)  # noqa: E731
    whole = render(light, True)
    if real(whole) != render(messages, True):
        return _slow(messages, "as it changes the contents")
    cuts = _cuts(light, contents, whole, render) if len(light) > EXACT else _exact_cuts(light, whole, render)
    if cuts is None:
        return _slow(messages, "as it renders earlier turns anew")
    pieces = [whole[a:b] for a, b in zip([0] + cuts, cuts + [len(whole)], strict=True)]
    spans = []
    tok = engine.tokenizer
    for k, piece in enumerate(pieces):
        content = contents[k] if k < len(contents) else None
        mark = piece.find(f"\x00{k}\x00") if content is not None else -1
        start = len(real(piece[:mark])) if mark >= 0 else None
        spans.append(tuple(encode_turn(tok, real(piece), content, k == 0, start)))
    bodies: list = [Message(str(m.get("role")), unmark(contents[i] or ""), spans[i]) for i, m in enumerate(messages)]
    bodies.append(GenerationPrompt(spans[-1]))
    return bodies, [t for sp in spans for t in sp]


def _slow(messages: list[dict], why: str) -> tuple[list, list[int]] | None:
    """The one-message-at-a-time path renders the whole conversation once per message."""
    if len(messages) > SLOW_MAX:
        raise BadRequest(f"with this model's chat template, {why}, a conversation may have at most "
                         f"{SLOW_MAX} messages, not {len(messages)}", param="messages")
    return None  # the caller takes the slow path


def _exact_cuts(light: list[dict], whole: str, render) -> list[int] | None:
    """Where each message's rendering ends in `whole`: the length of the conversation up to
    it, rendered. A template that closes a message differently once another follows it
    (gpt-oss's Harmony: a last assistant message ends `<|return|>`, an earlier one `<|end|>`)
    has the cut right after the message's content, its closing going with the next message's
    span; None if the renderings part before that content ends (the slow path then)."""
    cuts: list[int] = []
    for k in range(len(light)):
        upto = render(light[:k + 1], False)
        cut = len(upto)
        if not whole.startswith(upto):
            mark = f"\x00{k}\x00"
            at = whole.find(mark)
            same = next((i for i, (a, b) in enumerate(zip(whole, upto, strict=False)) if a != b),
                        min(len(whole), len(upto)))
            if at < 0 or at + len(mark) > same:
                return None
            cut = at + len(mark)
        if cuts and cut < cuts[-1]:
            return None
        cuts.append(cut)
    return cuts


def _cuts(light: list[dict], contents: list, whole: str, render) -> list[int] | None:
    """The same cuts for a long conversation: exact for the first EXACT messages and the
    last; between, each message's opening markup (the text after the previous cut, before
    its content) is one already seen for its role, or learned with an exact rendering while
    EXTRA_RENDERS last; past that, the cut is where its content starts. Before a message
    with no content (a call only) the cut follows the message's own closing markup instead."""
    n = len(light)
    marks: list[int | None] = []
    at = 0
    for k in range(n):
        if contents[k] is None:
            marks.append(None)
            continue
        at = whole.find(f"\x00{k}\x00", at)
        if at < 0:
            return None  # a content the template leaves out
        marks.append(at)
        at += len(f"\x00{k}\x00")
    head = _exact_cuts(light[:EXACT], whole, render)
    if head is None:
        return None
    openings: dict[str, set[str]] = {}  # by role: the markup between a cut and the content
    closings: dict[str, set[str]] = {}  # by role: the markup between the content and the cut

    def learn(k: int, cut: int) -> None:
        nxt = marks[k + 1] if k + 1 < n else None
        if nxt is not None and cut <= nxt:
            openings.setdefault(str(light[k + 1].get("role")), set()).add(whole[cut:nxt])
        mk = marks[k]
        if mk is not None and mk < cut:
            closings.setdefault(str(light[k].get("role")), set()).add(whole[mk + len(f"\x00{k}\x00"):cut])

    for k, cut in enumerate(head):
        learn(k, cut)
    cuts, spare = list(head), EXTRA_RENDERS
    for k in range(EXACT, n - 1):
        mk, nxt = marks[k], marks[k + 1]
        lo = cuts[-1] if mk is None else mk + len(f"\x00{k}\x00")
        if nxt is not None:
            gap = whole[lo:nxt]
            seen = [o for o in openings.get(str(light[k + 1].get("role")), ()) if gap.endswith(o)]
            if seen:
                cuts.append(nxt - len(max(seen, key=len)))
                continue
        elif mk is not None:  # the next message has no content to find: this one's closing
            seen = [c for c in closings.get(str(light[k].get("role")), ()) if whole.startswith(c, lo)]
            if seen:
                cuts.append(lo + len(max(seen, key=len)))
                continue
        if spare > 0:
            spare -= 1
            upto = render(light[:k + 1], False)
            if whole.startswith(upto) and lo <= len(upto) <= (len(whole) if nxt is None else nxt):
                cuts.append(len(upto))
                learn(k, len(upto))
                continue
        cuts.append(lo if nxt is None else nxt)
    last = render(light, False)
    if not whole.startswith(last) or len(last) < cuts[-1]:
        return None
    cuts.append(len(last))
    return cuts
