"""Token ids -> text deltas, incrementally: a multi-byte UTF-8 character split across
tokens never comes out split, and stop strings are caught across token boundaries."""

from __future__ import annotations

import codecs

from .stops import StopMatcher


class TextStream:
    def __init__(self, pieces: list[bytes], eog: frozenset[int], stops: tuple[str, ...] = ()):
        self._pieces = pieces
        self._eog = eog
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopMatcher(stops)
        self.stopped_by: str | None = None

    def push(self, token: int) -> str:
        """Text that token makes safe to emit ('' while held back). After a stop string
        matched, `stopped_by` is set and the caller must end the generation."""
        if self.stopped_by is not None or token in self._eog:
            return ""
        text = self._utf8.decode(self._pieces[token] if 0 <= token < len(self._pieces) else b"")
        out, hit = self._stops.feed(text)
        if hit is not None:
            self.stopped_by = hit
        return out

    def finish(self) -> str:
        """The rest, at the end of the generation (a held partial stop string, a dangling
        incomplete UTF-8 sequence as U+FFFD)."""
        if self.stopped_by is not None:
            return ""
        out, hit = self._stops.feed(self._utf8.decode(b"", final=True))
        if hit is not None:
            self.stopped_by = hit
            return out
        return out + self._stops.flush()
