"""Waiting jobs: one FIFO per QoS class; the next job is the head of the best class.

(Lane caps per class and aging come with the QoS scheduler; the seam is `pop`.)"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

from ..request import Qos

T = TypeVar("T")


class ClassQueues(Generic[T]):
    def __init__(self) -> None:
        self._q: dict[Qos, deque[tuple[str, T]]] = {q: deque() for q in Qos}

    def push(self, qos: Qos, key: str, item: T) -> None:
        self._q[qos].append((key, item))

    def push_front(self, qos: Qos, key: str, item: T) -> None:
        self._q[qos].appendleft((key, item))

    def pop(self) -> T | None:
        for q in Qos:
            if self._q[q]:
                return self._q[q].popleft()[1]
        return None

    def remove(self, key: str) -> T | None:
        for dq in self._q.values():
            for i, (k, item) in enumerate(dq):
                if k == key:
                    del dq[i]
                    return item
        return None

    def __len__(self) -> int:
        return sum(len(d) for d in self._q.values())

    def __iter__(self) -> Iterator[T]:
        for q in Qos:
            for _, item in self._q[q]:
                yield item
