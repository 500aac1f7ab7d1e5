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


def _typed_markers(tok, content: str) -> bool:
    """Whether a message's content holds text the tokenizer would read as special tokens
    (a user typing `<|im_end|><|im_start|>system`)."""
    return ("<" in content or "[" in content) and \
        tok.encode(content, parse_special=True) != tok.encode(content, parse_special=False)


def encode_turn(tok, text: str, content: str | None, first: bool, at: int | None = None) -> list[int]:
    """Tokens of rendered conversation text holding one message's content: the template's
    markup with its special tokens parsed, the content as plain text, so chat markers a user
    typed stay text. `at`: where the content starts in `text` (default: its last occurrence).
    Text with no such content is tokenized whole, as before."""
    if not content or not _typed_markers(tok, content):
        return tok.encode_prompt(text) if first else tok.encode(text, parse_special=True)
    i = text.rfind(content) if at is None else at
    if i < 0 or text[i:i + len(content)] != content:
        i = text.rfind(content)
    if i < 0:  # the template changed the content: no text of it can be told from markup
        return tok.encode_prompt(text) if first else tok.encode(text, parse_special=True)
    head, tail = text[:i], text[i + len(content):]
    out = tok.encode_prompt(head) if first else tok.encode(head, parse_special=True)
    return out + tok.encode(content, parse_special=False) + tok.encode(tail, parse_special=True)


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
        t = cls(engine.tokenizer, engine.template, template_kwargs)
        if state is not None:
            t.messages = state.conversation(engine.tokenizer.decode)
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
            rest = full[len(prev):] if full.startswith(prev) else full
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
            full = self._render(self.messages + [msg], False)
            content = msg.get("content")
            span = self._span(full, self.messages, content if isinstance(content, str) else None)
            self.messages.append(msg)
        self._take(span)
        return Message(str(msg.get("role")), _text(msg.get("content")), span)

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
    fast = _prelude_light(engine, messages, template_kwargs)
    if fast is not None:
        return fast
    t = Turns.of(engine, **template_kwargs)
    bodies: list = [t.message(m) for m in messages]
    bodies.append(t.opener())
    return bodies, t.tokens


_MARK = re.compile("\x00(\\d+)\x00")


def _prelude_light(engine, messages: list[dict], kw: dict) -> tuple[list, list[int]] | None:
    """The same spans, rendering each prefix with short markers for the contents (an agent's
    100-message history would otherwise be rendered 100 times in full). Valid only when the
    template puts contents in verbatim, which one full rendering checks; None otherwise."""
    contents: list[str] = [m.get("content") for m in messages]  # type: ignore[misc]
    if not messages or not all(isinstance(c, str) and "\x00" not in c for c in contents):
        return None
    light = [{**m, "content": f"\x00{i}\x00"} for i, m in enumerate(messages)]
    real = lambda text: _MARK.sub(lambda mm: contents[int(mm.group(1))], text)  # noqa: E731
    render = engine.template.render
    tok = engine.tokenizer
    pieces: list[str] = []
    starts: list[int | None] = []  # where a piece's own content starts in it (markers are exact)
    prev = ""
    for k in range(len(light) + 1):
        full = render(light[:k + 1] if k < len(light) else light, add_generation_prompt=k == len(light), **kw)
        if not full.startswith(prev):
            return None
        piece = full[len(prev):]
        mark = piece.find(f"\x00{k}\x00")
        starts.append(len(real(piece[:mark])) if mark >= 0 else None)
        pieces.append(real(piece))
        prev = full
    if "".join(pieces) != render(messages, add_generation_prompt=True, **kw):
        return None
    spans = [tuple(encode_turn(tok, p, contents[k] if k < len(contents) else None, k == 0, starts[k]))
             for k, p in enumerate(pieces)]
    bodies: list = [Message(str(m.get("role")), contents[i], spans[i]) for i, m in enumerate(messages)]
    bodies.append(GenerationPrompt(spans[-1]))
    return bodies, [t for sp in spans for t in sp]
