"""The daemon's side of Link W: spawn a worker, handshake, run steps, stop it.

One WorkerProcess is one OS process; the engine makes a new one to respawn. Any failure of
the process or the link surfaces as WorkerCrashed, never as a raw OS or protocol error."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from array import array
from typing import Any

from ..config import THREAD_ENV
from ..errors import ProtocolError, WorkerCrashed
from ..link.conn import Refused
from ..plan import StepPlan, StepResult
from ..runtime.base import ModelInfo
from ..net.transport import Link
from .protocol import LINK_W, VERSION, Hello, HelloAck, Msg, Shutdown, WorkerError, WorkerSettings

log = logging.getLogger("superfluid.worker")

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The daemon's environment without its secrets (API keys, the fleet token, cloud
    credentials): a worker runs model code and needs none of them."""
    env = os.environ if environ is None else environ
    return {**THREAD_ENV, **{k: v for k, v in env.items() if not any(w in k.upper() for w in SECRET_WORDS)}}


class WorkerProcess:
    def __init__(self, spec: WorkerSettings):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.info: ModelInfo | None = None
        # the disk tier's index: (key, tokens, namespace, checkpoint marks) an entry (None: no tier)
        self.kv_entries: list[tuple[int, tuple[int, ...], str, tuple[int, ...]]] | None = None
        self._link: Link | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self) -> ModelInfo:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [sys.executable, "-m", "superfluid.worker.main", "--fd", str(child.fileno())]
        fds = [child.fileno()] + ([self.spec.rpc_listen_fd] if self.spec.rpc_listen_fd >= 0 else [])  # RPC joins
        self.proc = subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL, env=worker_env())
        child.close()
        self._link = await Link.over(parent, LINK_W)
        try:
            ack: HelloAck = await self._link.greet(Hello((VERSION,), self.spec), self.spec.load_timeout_s)
        except TimeoutError:
            await self.stop()
            raise WorkerCrashed("the worker did not finish loading the model in time") from None
        except (ConnectionError, OSError, ProtocolError) as e:
            await self.stop()
            raise self._crashed(e) from None
        self.info = ModelInfo(**ack.info)
        ns = ack.kv_ns if ack.kv is not None and ack.kv_ns is not None and len(ack.kv_ns) == len(ack.kv) else None
        marks = ack.kv_marks if ack.kv is not None and ack.kv_marks is not None and len(
            ack.kv_marks) == len(ack.kv) else None
        self.kv_entries = None if ack.kv is None else [
            (k, tuple(array("i", t)), ns[i] if ns else "", tuple(int(m) for m in marks[i]) if marks else ())
            for i, (k, t) in enumerate(ack.kv)]
        return self.info

    def _crashed(self, e: Exception) -> WorkerCrashed:
        """What a failed link to the worker means, as the one error the engine handles."""
        if isinstance(e, Refused):
            return WorkerCrashed(f"the worker failed: {e.message}", code=e.reason)
        if isinstance(e, ProtocolError):
            return WorkerCrashed(f"the worker sent garbage: {e.message}")
        if type(e) is ConnectionError:  # EOF (or our own link closed): the worker is gone
            code = self.proc.poll() if self.proc else None
            return WorkerCrashed("the worker exited" + (f" (code {code})" if code is not None else ""))
        return WorkerCrashed(f"lost the worker: {e}")

    async def _recv(self) -> tuple[int, Any]:
        assert self._link is not None
        try:
            msg, body = await self._link.recv()
        except (ConnectionError, OSError, ProtocolError) as e:
            raise self._crashed(e) from e
        if isinstance(body, WorkerError):
            raise WorkerCrashed(f"the worker failed: {body.message}", code=body.code)
        return msg, body

    def send_step(self, plan: StepPlan) -> None:
        """Queue a plan to the worker; its result comes from `recv_step`. Splitting the two
        lets the engine hand out the last step's tokens while the worker runs the next."""
        try:
            assert self._link is not None
            self._link.send(plan, correlation=plan.step)
        except (ConnectionError, OSError, RuntimeError, AssertionError):
            pass  # a dead link surfaces in recv_step

    async def recv_step(self) -> StepResult:
        msg, body = await self._recv()
        if msg != Msg.STEP_RESULT:
            raise WorkerCrashed(f"unexpected {msg} from the worker")
        return body

    async def stop(self, timeout: float = 5.0) -> None:
        if self._link is not None:
            try:
                self._link.send(Shutdown())
                await asyncio.wait_for(self._link.drain(), 1.0)
            except (TimeoutError, ConnectionError, OSError, RuntimeError):
                pass
            self._link.close()
            self._link = None
        if self.proc is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
