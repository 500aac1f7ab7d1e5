"""The node side of Link F's session layer, pure: commands applied at most once, epochs
that only go up (a stale one is fenced), per-generation retry buffers of numbered token
events kept until the head acknowledges them, and leases: a generation is fenced when
its head has been silent for the lease (every message renews it; the head sends a
KEEPALIVE every second, idle or not)."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

SEEN_COMMANDS = 4096  # command ids remembered for at-most-once
SESSIONS = 65536  # session epochs remembered for fencing


@dataclass
class RetryBuffer:
    """One generation's token events: dense seq from 0, kept until acknowledged."""
    gen: str
    epoch: int
    session: str = ""
    next_seq: int = 0
    events: deque = field(default_factory=deque)  # (seq, payload), seq ascending
    done: bool = False  # its last event was emitted

    def emit(self, payload: object, last: bool = False) -> tuple[int, object]:
        ev = (self.next_seq, payload)
        self.events.append(ev)
        self.next_seq += 1
        self.done = self.done or last
        return ev

    def ack(self, upto: int) -> None:
        while self.events and self.events[0][0] <= upto:
            self.events.popleft()

    def tail(self, after: int) -> list[tuple[int, object]]:
        """Events after seq `after` (what a head that saw up to `after` is missing)."""
        return [e for e in self.events if e[0] > after]

    @property
    def finished(self) -> bool:
        """Every event emitted and acknowledged: the buffer can go."""
        return self.done and not self.events


class NodeState:
    def __init__(self) -> None:
        self.gens: dict[str, RetryBuffer] = {}
        self.epochs: OrderedDict[str, int] = OrderedDict()  # session -> highest epoch seen (bounded)
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()

    def first_time(self, cmd: int, head: str = "") -> bool:
        """True once per command id of a head (its HELLO's instance id): a resent command is
        not applied twice, and two heads' ids never collide."""
        key = (head, cmd)
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > SEEN_COMMANDS:
            self._seen.popitem(last=False)
        return True

    def admit(self, session: str, epoch: int) -> bool:
        """A command for (session, epoch): refused if the session is already at a later
        epoch (the sender is a fenced, older owner)."""
        if epoch < self.epochs.get(session, -1):
            return False
        self.epochs[session] = epoch
        self.epochs.move_to_end(session)
        if len(self.epochs) > SESSIONS:
            self.epochs.popitem(last=False)
        return True

    def revoke(self, session: str, epoch: int) -> list[str]:
        """The head moved the session on: generations below `epoch` are fenced; returns them."""
        self.epochs[session] = max(self.epochs.get(session, -1), epoch)
        return [g for g, b in self.gens.items() if b.epoch < epoch and b.session == session]

    def open(self, gen: str, epoch: int, session: str = "") -> RetryBuffer:
        buf = self.gens.get(gen)
        if buf is None or buf.epoch != epoch:
            buf = self.gens[gen] = RetryBuffer(gen, epoch, session)
        return buf

    def ack(self, gen: str, epoch: int, upto: int) -> None:
        buf = self.gens.get(gen)
        if buf is not None and buf.epoch == epoch:
            buf.ack(upto)
            if buf.finished:
                del self.gens[gen]

    def reconcile(self, view: dict[str, tuple[int, int]]) -> tuple[list[tuple[RetryBuffer, list]], list[str]]:
        """The head's view {gen: (epoch, last seq it has)} after a reconnect: the tails to
        resend, and the generations the node no longer has (lost: the head re-places them)."""
        resend, missing = [], []
        for gen, (epoch, last) in view.items():
            buf = self.gens.get(gen)
            if buf is None or buf.epoch != epoch:
                missing.append(gen)
                continue
            buf.ack(last)
            resend.append((buf, buf.tail(last)))
        return resend, missing


def expired(last_word: Mapping[str, float], now: float, lease_s: float) -> list[str]:
    """The generations whose lease ran out: `last_word` maps each to when its owning head
    was last heard from."""
    return [gen for gen, heard in last_word.items() if now - heard > lease_s]
