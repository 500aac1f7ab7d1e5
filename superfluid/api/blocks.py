"""The blocks of a streamed answer, opened as the typed output arrives: reasoning, text, and
each tool call from its start to its end. A piece of another kind closes the open block
first. Anthropic (content blocks) and Responses (output items) stream the same blocks in
their own events; each says what opening, adding to and closing a block look like."""

from __future__ import annotations

from typing import Protocol

from ..request import CallDelta, Chunk


class BlockEvents(Protocol):
    def open(self, index: int, kind: str, call: CallDelta | None) -> list[bytes]: ...

    def add(self, index: int, kind: str, piece: str) -> list[bytes]: ...

    def close(self, index: int, kind: str) -> list[bytes]: ...


class Blocks:
    def __init__(self, api: BlockEvents):
        self.api = api
        self.index = -1  # the open (or last) block's number
        self.kind: str | None = None  # "reasoning", "text", "call"; None: none open
        self.calls = 0

    def feed(self, c: Chunk) -> list[bytes]:
        """The events of a chunk's output."""
        out: list[bytes] = []
        if c.reasoning:
            out += self._to("reasoning") + self.api.add(self.index, "reasoning", c.reasoning)
        if c.text:
            out += self._to("text") + self.api.add(self.index, "text", c.text)
        for d in c.calls:
            if d.start:
                self.calls += 1
                out += self._to("call", d)
            if d.arguments and self.kind == "call":
                out += self.api.add(self.index, "call", d.arguments)
            if d.end and self.kind == "call":
                out += self.close()
        return out

    def text(self) -> list[bytes]:
        """An empty text block, when an answer said nothing at all."""
        return self._to("text")

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        kind, self.kind = self.kind, None
        return self.api.close(self.index, kind)

    def _to(self, kind: str, call: CallDelta | None = None) -> list[bytes]:
        if self.kind == kind and call is None:
            return []
        out = self.close()
        self.index += 1
        self.kind = kind
        return out + self.api.open(self.index, kind, call)
