"""The whole suite: superfluid's bytecode is compiled once before the tests start processes."""

import compileall
from pathlib import Path

import superfluid


def pytest_sessionstart(session):
    """Every daemon, worker, node and CLI a test starts imports superfluid. Where
    PYTHONDONTWRITEBYTECODE is set (CI's machines), an editable install has no .pyc files and
    each of those processes compiled the package's source again (~0.1 CPU-s a start); the
    controller (not each xdist worker) writes them once here, where they are stale."""
    if not hasattr(session.config, "workerinput"):
        compileall.compile_dir(Path(superfluid.__file__).parent, quiet=1)
