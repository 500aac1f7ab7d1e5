"""The head side of Link F's session layer, pure: it accepts each generation's token events
exactly once and in order (only the next seq of the current epoch; duplicates re-acked,
gaps dropped until the node resends), and hands out command ids and epochs that never
repeat."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Tracker:
    """One placed generation, as the head sees it."""
    gen: str
    epoch: int
    next_seq: int = 0  # the only seq accepted next

    def accept(self, epoch: int, seq: int) -> bool:
        """True when (epoch, seq) is the next event; False for a stale epoch, a duplicate
        or a gap (the caller re-acks the watermark; the node resends what is missing)."""
        if epoch != self.epoch or seq != self.next_seq:
            return False
        self.next_seq += 1
        return True

    @property
    def watermark(self) -> int:
        """The last seq accepted (-1: none yet)."""
        return self.next_seq - 1

    def replace(self, epoch: int) -> None:
        """Re-placed on another node: a new epoch, numbered from 0 again; anything from
        the old epoch is stale from now on."""
        if epoch <= self.epoch:
            raise ValueError(f"epoch {epoch} does not move on from {self.epoch}")
        self.epoch, self.next_seq = epoch, 0


class Counter:
    """Strictly increasing ids (command ids, epochs), from a floor that persists."""

    def __init__(self, floor: int = 0):
        self.value = floor

    def next(self) -> int:
        self.value += 1
        return self.value
