"""`superfluid serve` on a terminal (a real pseudo-terminal): the live monitor shows, `q`
hands back plain logs, Ctrl-C stops the server and its worker."""

import os
import pty
import select
import signal
import subprocess
import sys
import time

from .daemon import free_port


def read_until(fd, needle: bytes, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf and time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                break
    return buf


def test_live_monitor_on_a_terminal():
    master, slave = pty.openpty()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "superfluid.cli", "serve", "--port", str(port),
                             "--max-batch", "2", "--max-context", "512", "--threads", "1"],
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                            env={**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"})
    os.close(slave)
    try:
        screen = read_until(master, b"worker restarts", 120)
        assert b"worker restarts" in screen and b"lanes 0/2" in screen and b"SmolLM2-135M-Instruct" in screen
        os.write(master, b"q")
        after = read_until(master, b"monitor closed", 30)
        assert b"monitor closed" in after
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
