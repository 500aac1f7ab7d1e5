"""Stop strings over a stream of text deltas. A stop string split across tokens is still
caught: any tail of the text that could begin a stop string is held back until it can't."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Returns (text safe to emit, the stop string matched or None)."""
        if not self.stops:
            return text, None
        buf = self._held + text
        hit, at = None, len(buf)
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and i < at:
                hit, at = s, i
        if hit is not None:
            self._held = ""
            return buf[:at], hit
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold:]
        return buf[:len(buf) - hold], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
