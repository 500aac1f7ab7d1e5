"""The head side of Link F's session layer, pure: it accepts each generation's token events
exactly once and in order (only the next seq of the current epoch; duplicates re-acked,
gaps dropped until the node resends), decides when a generation whose node is gone moves
(failover) or is given up, and hands out command ids and epochs that never repeat."""

from __future__ import annotations

from dataclasses import dataclass

GIVE_UP_S = 30.0  # after its grace, how long a lost generation waits for a node that can take it


@dataclass
class Tracker:
    """One placed generation, as the head sees it."""
    gen: str
    epoch: int
    next_seq: int = 0  # the only seq accepted next
    lost_at: float | None = None  # when its node's link ended (0.0: the node lost it); None: placed and up

    def lost(self, at: float) -> None:
        """Its node's link ended at `at`, or (at=0.0) the node refused us or no longer has
        the generation: it moves as soon as failover looks. A later loss never delays an
        earlier one."""
        if self.lost_at is None or at == 0.0:
            self.lost_at = at

    def found(self) -> None:
        """Its node came back (reconciled) or it was placed anew."""
        self.lost_at = None

    def failover_due(self, now: float, grace: float) -> bool:
        """Lost for longer than `grace`: re-place it on another node."""
        return self.lost_at is not None and now - self.lost_at > grace

    def hopeless(self, now: float, grace: float) -> bool:
        """Lost, and no node could take it for GIVE_UP_S past its grace: fail it."""
        return self.lost_at is not None and now - self.lost_at > grace + GIVE_UP_S

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
        self.epoch, self.next_seq, self.lost_at = epoch, 0, None


class Counter:
    """Strictly increasing ids (command ids, epochs), from a floor that persists."""

    def __init__(self, floor: int = 0):
        self.value = floor

    def next(self) -> int:
        self.value += 1
        return self.value
