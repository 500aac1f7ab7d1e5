"""Start real fleet nodes (`superfluid node serve`) on loopback ports."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from ..scratch import scratch
from .daemon import free_port


class Node:
    def __init__(self, *args: str, max_context: int = 1024, auth_file: str | None = None, home: str | None = None,
                 port: int | None = None, join: str | None = None):
        """`node serve` on a loopback port, or with `join` (the head's HOST:PORT) `node join`."""
        self.port = port or free_port()
        self.home = home or scratch("superfluid-node-")
        how = ["join", join] if join else ["serve", "--listen", f"127.0.0.1:{self.port}"]
        cmd = [sys.executable, "-m", "superfluid.cli", "node", *how,
               "--threads", "1", "--max-context", str(max_context), *args]
        if auth_file:
            cmd += ["--auth-file", auth_file]
        self.log_path = os.path.join(scratch("superfluid-node-log-"), "node.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", "SUPERFLUID_HOME": self.home})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited: {self.log()}")
            if "serving" in self.log():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("node did not start")

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def together(*starts: Callable[[], Node]) -> list[Node]:
    """Nodes started at once, not one after another (each start is mostly a process loading
    its model while the caller polls its log); in the order given."""
    with concurrent.futures.ThreadPoolExecutor(len(starts)) as pool:
        futures = [pool.submit(f) for f in starts]
    nodes, errors = [], []
    for f in futures:
        try:
            nodes.append(f.result())
        except Exception as e:  # noqa: BLE001 -- stop the ones that did start, then raise
            errors.append(e)
    if errors:
        for n in nodes:
            n.stop()
        raise errors[0]
    return nodes
