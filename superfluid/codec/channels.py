"""Generated text split into channels as it streams: reasoning (`<think>...</think>` and
other markers a template defines), tool calls (the model's dialect, codec/dialects/) and the
content the user sees. Every API maps the channels onto its own shapes."""

from __future__ import annotations

from dataclasses import dataclass

from .dialects import BY_NAME, Dialect, Parts
from .tools import partial_suffix

THINK = ("<think>", "</think>")


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """How a request's output is split: tool-call format (None: no tools), reasoning
    markers (None: none), and whether the reply starts inside the reasoning (the template's
    opener already wrote the open marker)."""
    tools: Dialect | None = None
    reasoning: tuple[str, str] | None = None
    start_in_reasoning: bool = False


def spec_for(tools: Dialect | None, reasoning: tuple[str, str] | None, opener: str) -> ChannelSpec:
    """How a reply is split: calls in the tool format (None: no tools), reasoning between the
    template's markers, and whether the reply starts inside the reasoning because the
    assistant-turn opener (its text) already opened it."""
    return ChannelSpec(tools, reasoning, reasoning is not None and opener.rstrip().endswith(reasoning[0]))


def spec_from_wire(w: dict | None) -> ChannelSpec | None:
    """A ChannelSpec from its JSON form (a session's params, a fleet GENERATE_REQ)."""
    if not w:
        return None
    fmt = BY_NAME.get(w.get("tools") or "")
    r = w.get("reasoning")
    return ChannelSpec(fmt, tuple(r) if r else None, bool(w.get("start_in")))  # type: ignore[arg-type]


def spec_to_wire(s: ChannelSpec | None) -> dict | None:
    if s is None:
        return None
    return {"tools": s.tools.name if s.tools else None, "reasoning": list(s.reasoning) if s.reasoning else None,
            "start_in": s.start_in_reasoning}


def reasoning_markers(template_source: str) -> tuple[str, str] | None:
    return THINK if THINK[0] in template_source or THINK[1] in template_source else None


class Channels:
    def __init__(self, spec: ChannelSpec):
        self.spec = spec
        self._tools = spec.tools.parser() if spec.tools is not None else None
        self._in_reasoning = spec.start_in_reasoning and spec.reasoning is not None
        self._held = ""
        self._strip = False  # newlines right after the close marker are layout, not content

    @property
    def cut_call(self) -> bool:
        return self._tools is not None and self._tools.cut

    @property
    def hidden(self) -> bool:
        """The output is inside reasoning or a tool call now (not content)."""
        return self._in_reasoning or (self._tools is not None and self._tools.inside)

    @property
    def holding(self) -> bool:
        """Text is held back because it may be the start of a marker."""
        return bool(self._held) or (self._tools is not None and self._tools.holding)

    def feed(self, text: str) -> Parts:
        parts = Parts()
        content = self._split_reasoning(text, parts)
        self._content(content, parts, final=False)
        return parts

    def finish(self) -> Parts:
        parts = Parts()
        held, self._held = self._held, ""
        if self._in_reasoning:
            parts.reasoning += held
        else:
            self._content(held, parts, final=False)
        self._content("", parts, final=True)
        return parts

    def _split_reasoning(self, text: str, parts: Parts) -> str:
        if self.spec.reasoning is None:
            return text
        opn, cls = self.spec.reasoning
        buf, self._held = self._held + text, ""
        content = []
        if self._strip and buf:
            buf = buf.lstrip("\n")
            self._strip = not buf
        while buf:
            marker = cls if self._in_reasoning else opn
            i = buf.find(marker)
            if i < 0:
                keep = partial_suffix(buf, marker)
                piece, self._held = buf[:len(buf) - keep], buf[len(buf) - keep:]
                if self._in_reasoning:
                    parts.reasoning += piece
                else:
                    content.append(piece)
                break
            if self._in_reasoning:
                parts.reasoning += buf[:i]
            else:
                content.append(buf[:i])
            buf = buf[i + len(marker):]
            if self._in_reasoning:
                buf = buf.lstrip("\n")
                self._strip = not buf
            self._in_reasoning = not self._in_reasoning
        return "".join(content)

    def _content(self, text: str, parts: Parts, final: bool) -> None:
        if self._tools is None:
            parts.content += text
            return
        if text:
            parts.add(self._tools.feed(text))
        if final:
            parts.add(self._tools.finish())
