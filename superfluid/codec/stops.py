"""Stop strings over a stream of text deltas. A stop string split across tokens is still
caught: any tail of the text that could begin a stop string is held back until it can't.

All the stop strings are one Aho-Corasick automaton, so a delta costs the same whatever the
number of stop strings: each character moves one state, and the state's depth is exactly
the tail to hold back. The first stop string to complete ends the text (the longest, when
two complete on the same character)."""

from __future__ import annotations

from collections import deque


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self._goto: list[dict[str, int]] = [{}]
        self._fail: list[int] = [0]
        self._depth: list[int] = [0]
        self._out: list[int] = [-1]  # the longest stop string ending at this state (-1: none)
        for k, s in enumerate(self.stops):
            node = 0
            for ch in s:
                nxt = self._goto[node].get(ch)
                if nxt is None:
                    nxt = len(self._goto)
                    self._goto.append({})
                    self._fail.append(0)
                    self._depth.append(self._depth[node] + 1)
                    self._out.append(-1)
                    self._goto[node][ch] = nxt
                node = nxt
            self._out[node] = k
        todo = deque(self._goto[0].values())
        while todo:  # breadth first: a state's fail link is shallower, so already done
            node = todo.popleft()
            for ch, nxt in self._goto[node].items():
                f = self._fail[node]
                while f and ch not in self._goto[f]:
                    f = self._fail[f]
                self._fail[nxt] = self._goto[f].get(ch, 0) if self._goto[f].get(ch, 0) != nxt else 0
                if self._out[nxt] < 0:
                    self._out[nxt] = self._out[self._fail[nxt]]
                todo.append(nxt)
        self._state = 0
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Returns (text safe to emit, the stop string matched or None)."""
        if not self.stops:
            return text, None
        goto, fail, out = self._goto, self._fail, self._out
        buf = self._held + text
        state, base = self._state, len(self._held)
        for i, ch in enumerate(text):
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            if out[state] >= 0:
                hit = self.stops[out[state]]
                self._state, self._held = 0, ""
                return buf[:base + i + 1 - len(hit)], hit
        self._state = state
        hold = self._depth[state]
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold], None

    def flush(self) -> str:
        held, self._held, self._state = self._held, "", 0
        return held
