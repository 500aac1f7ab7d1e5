"""Lanes: the fixed set of KV sequence ids a worker holds, handed out lowest first."""

from __future__ import annotations

import heapq


class LanePool:
    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("need at least one lane")
        self.size = n
        self._free = list(range(n))
        heapq.heapify(self._free)

    def acquire(self) -> int | None:
        return heapq.heappop(self._free) if self._free else None

    def release(self, seq: int) -> None:
        if seq in self._free or not 0 <= seq < self.size:
            raise ValueError(f"lane {seq} is not in use")
        heapq.heappush(self._free, seq)

    @property
    def free(self) -> int:
        return len(self._free)
