"""Start a real `superfluid serve` (daemon + worker) on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from ..scratch import scratch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, *args: str, max_context: int = 1024, max_batch: int = 8, home: str | None = None,
                 threads: int = 1, env: dict[str, str] | None = None):
        self.home = home or scratch("superfluid-home-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "superfluid.cli", "serve", *args, "--port", str(self.port),
               "--max-context", str(max_context), "--max-batch", str(max_batch), "--threads", str(threads)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", "SUPERFLUID_HOME": self.home,
                                          **(env or {})})
        self.banner = ""  # the `serving ... on http://...` line
        self.startup: list[str] = []  # the lines before it (the first: the llama.cpp build)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    while not self.banner:  # printed before the server answers
                        line = self.proc.stdout.readline()
                        if not line or " serving " in line:
                            self.banner = line or "(no banner)"
                        else:
                            self.startup.append(line)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("daemon did not become healthy")

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def worker_pid(self) -> int:
        return next(iter(self.health()["models"].values()))["worker_pid"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
