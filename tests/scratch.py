"""Folders the tests make under the system temp dir, removed when the test process ends."""

from __future__ import annotations

import atexit
import shutil
import tempfile


def scratch(prefix: str) -> str:
    """A fresh folder, removed at exit: daemons' and nodes' homes (a KV disk tier is GBs),
    converted models, caches of pulled files."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path
