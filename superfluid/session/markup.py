"""Client strings outside a message's content stay text when a chat template renders them.

A message's `content` is kept apart from the template's markup where it lands in the
rendering (turns.encode_turn). Every other string a client sends also reaches the template:
a tool call's name and arguments, `tool_call_id`, the tools' JSON (names, descriptions,
schemas), any other field of a message. The template escapes them (tojson), trims them or
writes them into a dialect's call syntax, so they cannot be found verbatim in the rendering.
Instead, before rendering, each chat marker in such a string (text the tokenizer reads as a
control token only when it parses special tokens, `<|im_start|>`) is replaced by a
placeholder that every such transformation leaves alone: two noncharacters around the
marker's UTF-8 in hex. The rendering is tokenized with special tokens parsed between the
placeholders and each placeholder as its marker's plain text (`encode`). A string whose
markers cannot all be replaced (a special token not shaped like <...> or [...]) is refused.
The limit: markers formed across the boundary of a client string and the template's own
text are not seen (the same limit as for content)."""

from __future__ import annotations

import re

from ..errors import BadRequest

OPEN, CLOSE = "\ufdd0", "\ufdd1"
_PLACED = re.compile("\ufdd0((?:[0-9a-f]{2}){1,256})\ufdd1")
_CANDIDATE = re.compile(r"<[^<>\s]{1,120}>|\[[^\[\]\s]{1,120}\]")
MAX_DEPTH = 128  # nesting of a message's fields a template may render


def typed_markers(tok, text: str) -> bool:
    """Whether `text` holds text the tokenizer would read as special tokens (a user typing
    `<|im_end|><|im_start|>system`)."""
    return ("<" in text or "[" in text) and \
        tok.encode(text, parse_special=True) != tok.encode(text, parse_special=False)


def _placeholder(marker: str) -> str:
    return OPEN + marker.encode().hex() + CLOSE


def mark(tok, text: str, param: str = "messages") -> str:
    """`text` with each chat marker in it replaced by its placeholder (unchanged without)."""
    if not typed_markers(tok, text):
        return text

    def sub(m: re.Match) -> str:
        c = m.group(0)
        return _placeholder(c) if tok.encode(c, parse_special=True) != tok.encode(c, parse_special=False) else c
    out = _CANDIDATE.sub(sub, text)
    if typed_markers(tok, out):
        raise BadRequest("a string in the request holds text this model reads as chat markup (special tokens) "
                         "in a form that cannot be kept as text", param=param)
    return out


def mark_tree(tok, value: object, param: str, depth: int = 0) -> object:
    """Every string in a JSON-like value (keys too) marked."""
    if depth > MAX_DEPTH:
        raise BadRequest(f"{param} nests more than {MAX_DEPTH} levels deep", param=param)
    if isinstance(value, str):
        return mark(tok, value, param)
    if isinstance(value, dict):
        return {(mark(tok, k, param) if isinstance(k, str) else k): mark_tree(tok, v, param, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mark_tree(tok, v, param, depth + 1) for v in value]
    return value


def mark_tools(tok, tools: list[dict]) -> list[dict]:
    return [mark_tree(tok, t, "tools") for t in tools]  # type: ignore[misc]


def mark_message(tok, msg: dict, content: bool = False) -> dict:
    """A message with every field but its role and content marked (content has its own
    protection, which keeps the text exactly as the client wrote it). `content`: the
    content too, for a message whose span is already taken, so that a template that renders
    earlier turns anew never makes its markers control tokens (Turns)."""
    if not isinstance(msg, dict):
        return msg
    keep = ("role",) if content and isinstance(msg.get("content"), str) else ("role", "content")
    return {k: v if k in keep else mark_tree(tok, v, "messages") for k, v in msg.items()}


def mark_kwargs(tok, kwargs: dict) -> dict:
    """Template variables from the request (the tools' JSON above all) marked."""
    return {k: mark_tree(tok, v, "tools" if k == "tools" else "chat_template_kwargs") for k, v in kwargs.items()}


def unmark(text: str) -> str:
    """Text with its placeholders back as the markers they stand for (what a session records)."""
    return _PLACED.sub(lambda m: _marker(m) or m.group(0), text) if OPEN in text else text


def _marker(m: re.Match) -> str | None:
    try:
        return bytes.fromhex(m.group(1)).decode()
    except ValueError:
        return None


def encode(tok, text: str, parse_special: bool, first: bool = False) -> list[int]:
    """Tokens of rendered text: special tokens parsed as `parse_special` says, each
    placeholder as its marker's plain text; `first`: the prompt's start (BOS added as the
    model wants it)."""
    head_enc = tok.encode_prompt if first else (lambda s: tok.encode(s, parse_special=parse_special))
    if OPEN not in text:
        return head_enc(text)
    out: list[int] = []
    pos = 0
    for m in _PLACED.finditer(text):
        marker = _marker(m)
        if marker is None:
            continue
        seg = text[pos:m.start()]
        out += head_enc(seg) if pos == 0 and first else (tok.encode(seg, parse_special=parse_special) if seg else [])
        out += tok.encode(marker, parse_special=False)
        pos = m.end()
    rest = text[pos:]
    if pos == 0:
        return head_enc(text)
    return out + (tok.encode(rest, parse_special=parse_special) if rest else [])
