"""Bounds on a pull the daemon starts for a client (Ollama's /api/pull, an admin's load by
hub name; issue 54): the files a name picks are refused when they are bigger than `max_bytes`
in all, or when downloading them would leave less than `min_free` bytes free on the cache's
disk; the disk is looked at again every `every` bytes while they arrive, and a file that
grows past what the hub listed for it is stopped. A stopped download's partial file is
removed (runtime/hub.py). `superfluid pull` on the command line has no bounds: its user
watches it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError
from ..limits import PULL_MAX_BYTES, PULL_MIN_FREE

GB = 1 << 30


class PullInProgress(ModelLoadError):
    """This name is being pulled already (or the daemon runs as many pulls as it may)."""
    status = 409
    code = "pull_in_progress"
    retry_after = 5.0


class PullTooLarge(ModelLoadError):
    status = 413
    code = "pull_too_large"


class PullNoRoom(ModelLoadError):
    """The cache's disk would fill: HTTP's 507."""
    status = 507
    code = "insufficient_storage"


@dataclass(frozen=True)
class Bounds:
    max_bytes: int = PULL_MAX_BYTES  # a pull's files in all
    min_free: int = PULL_MIN_FREE  # left free on the cache's disk, before and all through the download
    every: int = 16 << 20  # bytes downloaded between two looks at the disk

    def before(self, name: object, total: int, new: int, where: str) -> None:
        """`total` bytes the name picks, `new` of them still to download into `where`."""
        if total > self.max_bytes:
            raise PullTooLarge(f"{name} is {total / GB:.1f} GB; this server pulls at most {self.max_bytes / GB:.1f} GB")
        free = free_bytes(where)
        if free - new < self.min_free:
            raise PullNoRoom(f"{name} needs {new / GB:.1f} GB more on the disk of {where}, which has "
                             f"{free / GB:.1f} GB free; {self.min_free / GB:.1f} GB must stay free")

    def watch(self, name: object, filename: str, expected: int, where: str) -> Callable[[int], None]:
        """A check called with a file's bytes downloaded so far: raises to stop the download."""
        next_look = [self.every]

        def check(n: int) -> None:
            if expected and n > expected:
                raise PullTooLarge(f"{name}: {filename} arrived bigger than the {expected} bytes the hub listed; "
                                   "the download was stopped")
            if n >= next_look[0]:
                next_look[0] = n + self.every
                free = free_bytes(where)
                if free < self.min_free:
                    raise PullNoRoom(f"{name}: the disk of {where} has {free / GB:.1f} GB free, under the "
                                     f"{self.min_free / GB:.1f} GB that must stay free; the download was stopped")
        return check


def free_bytes(where: str) -> int:
    """Free bytes on the disk `where` is (or would be) on."""
    p = Path(where)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free
