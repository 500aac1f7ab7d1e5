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
from dataclasses import dataclass

from ..errors import ProtocolError, WorkerCrashed
from ..link.frame import FrameDecoder
from ..plan import StepPlan, StepResult
from ..runtime.base import ModelInfo
from .protocol import SUPPORTED, Msg, decode, encode

log = logging.getLogger("superfluid.worker")


@dataclass(frozen=True)
class WorkerSpec:
    model: str
    lanes: int
    ctx: int
    threads: int
    batch_tokens: int
    runtime: str = "llamacpp"
    load_timeout_s: float = 300.0
    stages: tuple = ()  # the pipeline runtime's stage nodes, (host, port)
    spares: tuple = ()  # stage nodes that stand in for unreachable ones
    stage_psk: bytes | None = None  # their fleet token's PSK (passed in the environment, not argv)
    split: str = "even"  # how the stages share the layers: even or memory
    pooling: str | None = None  # llama.cpp embeddings: mean, cls or last (None: the GGUF's)
    kv_dir: str = ""  # the disk tier of the KV cache ("" : none)
    kv_disk_mb: float = 0.0  # its size cap


class WorkerProcess:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.info: ModelInfo | None = None
        self.kv_entries: list[tuple[int, tuple[int, ...]]] | None = None  # the disk tier's index (None: no tier)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._dec = FrameDecoder()
        self._frames: list = []

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self) -> ModelInfo:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        s = self.spec
        cmd = [sys.executable, "-m", "superfluid.worker", "--fd", str(child.fileno()),
               "--model", s.model, "--runtime", s.runtime, "--lanes", str(s.lanes),
               "--ctx", str(s.ctx), "--threads", str(s.threads),
               "--batch-tokens", str(s.batch_tokens)]
        if s.pooling:
            cmd += ["--pooling", s.pooling]
        if s.kv_dir and s.kv_disk_mb > 0:
            cmd += ["--kv-dir", s.kv_dir, "--kv-disk-mb", str(s.kv_disk_mb)]
        env = os.environ.copy()
        if s.stages:
            cmd += ["--stages", ",".join(f"{h}:{p}" for h, p in s.stages), "--split", s.split,
                    "--spares", ",".join(f"{h}:{p}" for h, p in s.spares)]
            if s.stage_psk:
                env["SUPERFLUID_FLEET_PSK"] = s.stage_psk.hex()
        self.proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, env=env)
        child.close()
        self._reader, self._writer = await asyncio.open_unix_connection(sock=parent)
        self._send(Msg.HELLO, {"versions": list(SUPPORTED)})
        try:
            msg, body = await asyncio.wait_for(self._recv(), self.spec.load_timeout_s)
            if msg != Msg.HELLO_ACK:
                raise WorkerCrashed(f"the worker answered {msg} to HELLO")
        except TimeoutError:
            await self.stop()
            raise WorkerCrashed("the worker did not finish loading the model in time") from None
        except WorkerCrashed:
            await self.stop()
            raise
        self.info = ModelInfo(**body["info"])
        kv = body.get("kv")
        self.kv_entries = None if kv is None else [(int(k), tuple(array("i", bytes(t)))) for k, t in kv]
        return self.info

    def _send(self, msg: Msg, body, **kw) -> None:
        assert self._writer is not None
        self._writer.write(encode(msg, body, **kw))

    async def _recv(self):
        assert self._reader is not None
        while not self._frames:
            try:
                data = await self._reader.read(1 << 20)
            except (ConnectionError, OSError) as e:
                raise WorkerCrashed(f"lost the worker: {e}") from e
            if not data:
                code = self.proc.poll() if self.proc else None
                raise WorkerCrashed("the worker exited" + (f" (code {code})" if code is not None else ""))
            try:
                self._frames.extend(self._dec.feed(data))
            except ProtocolError as e:
                raise WorkerCrashed(f"the worker sent garbage: {e}") from e
        msg, body = decode(self._frames.pop(0))
        if msg == Msg.ERROR:
            code = body.get("code")  # a runtime's typed error (e.g. a pipeline stage that went away)
            raise WorkerCrashed(f"the worker failed: {body.get('message')}", code=str(code) if code else None)
        return msg, body

    def send_step(self, plan: StepPlan) -> None:
        """Queue a plan to the worker; its result comes from `recv_step`. Splitting the two
        lets the engine hand out the last step's tokens while the worker runs the next."""
        try:
            self._send(Msg.STEP, plan.to_wire(), correlation=plan.step)
        except (ConnectionError, OSError, RuntimeError):
            pass  # a dead link surfaces in recv_step

    async def recv_step(self) -> StepResult:
        try:
            msg, body = await self._recv()
        except (ConnectionError, OSError) as e:
            raise WorkerCrashed(f"lost the worker: {e}") from e
        if msg != Msg.STEP_RESULT:
            raise WorkerCrashed(f"unexpected {msg} from the worker")
        return StepResult.from_wire(body)

    async def stop(self, timeout: float = 5.0) -> None:
        if self._writer is not None:
            try:
                self._send(Msg.SHUTDOWN, {})
                await asyncio.wait_for(self._writer.drain(), 1.0)
            except (TimeoutError, ConnectionError, OSError, RuntimeError):
                pass
            self._writer.close()
            self._writer = None
        if self.proc is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
