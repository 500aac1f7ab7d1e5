"""The worker process: owns one runtime, answers Link W on an inherited socket.

Started by the supervisor as `python -m superfluid.worker.main --fd N`; everything else it
is configured with comes in the daemon's HELLO (protocol.WorkerSettings). It dies with its
parent (PR_SET_PDEATHSIG) and exits on EOF, so a daemon that is killed leaves no orphan
behind."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import socket
import sys
import time
import traceback
from array import array
from typing import Any

from ..errors import ProtocolError
from ..runtime.registry import load_runtime
from ..net.transport import Link
from .protocol import LINK_W, VERSION, HelloAck, Msg, WorkerError, WorkerSettings


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _attach_kv_store(runtime, s: WorkerSettings) -> tuple[tuple | None, tuple | None, tuple | None]:
    """The disk tier, where the runtime has one and the daemon asked for it: its entries
    (key, int32 tokens), their namespaces and their checkpoint marks go to the scheduler's
    index in HELLO_ACK (None: no tier)."""
    if not (s.kv_dir and s.kv_disk_mb > 0 and runtime.kv_format):
        return None, None, None
    from ..runtime.kvstore import KvStore, file_fingerprint
    runtime.kv_store = KvStore(s.kv_dir, file_fingerprint(s.model, runtime.kv_format), int(s.kv_disk_mb * (1 << 20)))
    entries = runtime.kv_store.scan()
    return (tuple((key, array("i", tokens).tobytes()) for key, tokens, _, _ in entries),
            tuple(ns for _, _, ns, _ in entries), tuple(marks for *_, marks in entries))


class _Failed(Exception):
    """The runtime failed (not the link): reported to the daemon as it is."""


def _error(e: BaseException) -> WorkerError:
    code = getattr(e, "code", None)
    return WorkerError(getattr(e, "message", None) or f"{type(e).__name__}: {e}", str(code) if code else None)


STAGE_LOST_EXIT = 75


def _watch_rpc(nodes, link: Link) -> None:
    """A model split over RPC nodes (runtime/rpc_link.py) cannot go on without one of them:
    the daemon hears `stage_unavailable` (its running requests fail with it, and a new worker
    loads the model on the nodes still there) and this process ends. Both ways a lost node
    shows: its link ends while we wait (the links' thread says so), or llama.cpp's call to it
    fails mid-step (ggml aborts the process: its abort hook says so first)."""
    from ..runtime import rpc

    def die(why: str) -> None:
        try:
            link.send(WorkerError(why, "stage_unavailable"))
            _linger(link)
        except (ConnectionError, OSError, RuntimeError):
            pass
        os._exit(STAGE_LOST_EXIT)
    loop = asyncio.get_running_loop()
    nodes.fatal = lambda why: loop.call_soon_threadsafe(die, why)
    rpc.on_abort(lambda msg: die(nodes.lost or f"llama.cpp's RPC backend failed: {msg}"))


def _linger(link: Link, timeout: float = 3.0) -> None:
    """Read and drop what the daemon still sends until it closes its end (it does once it has
    the error): a process that exits with unread input resets the connection, and the
    daemon would lose the error it was just sent."""
    sock = socket.socket(fileno=os.dup(link.writer.get_extra_info("socket").fileno()))
    sock.settimeout(0.1)
    deadline = time.monotonic() + timeout
    with sock:
        while time.monotonic() < deadline:
            try:
                if not sock.recv(65536):
                    return
            except TimeoutError:
                continue
            except OSError:
                return


async def serve(sock: socket.socket) -> int:
    link = await Link.over(sock, LINK_W)
    runtime: Any = None
    try:
        try:
            hello = await link.welcome(timeout=None)
        except ProtocolError as e:
            link.send(WorkerError(f"no common Link W version ({e.message})"))
            await link.drain()
            return 2
        try:
            runtime = load_runtime(hello.settings)
        except Exception as e:
            link.send(_error(e))
            await link.drain()
            return 3
        if getattr(runtime, "rpc", None) is not None:
            _watch_rpc(runtime.rpc, link)
        kv, kv_ns, kv_marks = _attach_kv_store(runtime, hello.settings)
        link.send(HelloAck(VERSION, runtime.info.to_wire(), kv, kv_ns, kv_marks))

        def on_message(kind: int, body: Any) -> None:
            if kind == Msg.STEP:
                try:
                    result = runtime.step(body)
                except Exception as e:
                    raise _Failed() from e
                link.send(result, correlation=body.step)
            elif kind == Msg.SHUTDOWN:
                link.close()
            else:
                raise ProtocolError(f"unexpected message {kind} from the daemon")
        await link.serve(on_message)
        return 0
    except ConnectionError:
        return 0  # the daemon is gone
    except Exception as e:
        cause = e.__cause__ if isinstance(e, _Failed) and e.__cause__ is not None else e
        traceback.print_exception(cause)
        try:
            link.send(_error(cause))
            await link.drain()
        except (ConnectionError, OSError):
            pass
        return 1
    finally:
        link.close()
        if runtime is not None:
            if runtime.kv_store is not None:
                runtime.kv_store.close()  # queued saves reach the disk before the process goes
            runtime.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="superfluid.worker")
    p.add_argument("--fd", type=int, required=True, help="the inherited socket of Link W")
    args = p.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when we stop
    sock = socket.socket(fileno=args.fd)
    try:
        return asyncio.run(serve(sock))
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
