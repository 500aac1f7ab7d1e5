"""The worker process: owns one runtime, answers Link W on an inherited socket.

Started by the supervisor as `python -m superfluid.worker --fd N --model PATH ...`. It dies
with its parent (PR_SET_PDEATHSIG) and exits on EOF, so a daemon that is killed leaves no
orphan behind."""

from __future__ import annotations

import argparse
import importlib
from array import array
import ctypes
import os
import signal
import socket
import sys
import traceback

from ..errors import ProtocolError
from ..link.frame import FrameDecoder
from ..plan import StepPlan
from .protocol import SUPPORTED, VERSION, Msg, decode, encode


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


TORCH_RUNTIMES = {"transformers": ("..runtime.transformers", "TransformersRuntime"),
                  "sentence": ("..runtime.sentence", "SentenceRuntime")}


def _load(args: argparse.Namespace):
    if args.runtime == "llamacpp":
        from ..runtime.llamacpp import LlamaCppRuntime
        return LlamaCppRuntime(args.model, lanes=args.lanes, n_ctx=args.ctx,
                               threads=args.threads, batch_tokens=args.batch_tokens, pooling=args.pooling or None)
    if args.runtime in TORCH_RUNTIMES:  # transformers; sentence: embeddings or a cross-encoder
        module, name = TORCH_RUNTIMES[args.runtime]
        try:
            cls = getattr(importlib.import_module(module, __package__), name)
        except ImportError as e:
            raise RuntimeError(f"the {args.runtime} runtime needs torch and transformers: "
                               f"pip install 'superfluid[hf]' ({e})") from None
        return cls(args.model, lanes=args.lanes, n_ctx=args.ctx, threads=args.threads, batch_tokens=args.batch_tokens)
    if args.runtime == "pipeline":  # a model split by layers over stage nodes (fleet/pipeline.py)
        from ..fleet.pipeline import PipelineRuntime
        def addrs(s: str) -> list[tuple[str, int]]:
            return [(h, int(p)) for h, _, p in (x.rpartition(":") for x in s.split(",") if x)]
        psk = os.environ.pop("SUPERFLUID_FLEET_PSK", None)
        return PipelineRuntime(args.model, addrs(args.stages), bytes.fromhex(psk) if psk else None, lanes=args.lanes,
                               n_ctx=args.ctx, split=args.split, spares=addrs(args.spares))
    raise SystemExit(f"unknown runtime {args.runtime}")


def _attach_kv_store(runtime, args: argparse.Namespace) -> list:
    """The disk tier, where the runtime has one and the daemon asked for it: its entries
    (key, int32 tokens) go to the scheduler's index in HELLO_ACK."""
    if not (args.kv_dir and args.kv_disk_mb > 0 and runtime.kv_format):
        return []
    from ..runtime.kvstore import KvStore, file_fingerprint
    runtime.kv_store = KvStore(args.kv_dir, file_fingerprint(args.model, runtime.kv_format),
                               int(args.kv_disk_mb * (1 << 20)))
    return [[key, array("i", tokens).tobytes()] for key, tokens in runtime.kv_store.scan()]


def serve(sock: socket.socket, args: argparse.Namespace) -> int:
    dec = FrameDecoder()
    runtime = None
    try:
        while True:
            data = sock.recv(1 << 20)
            if not data:
                return 0  # the daemon is gone
            for frame in dec.feed(data):
                msg, body = decode(frame)
                if msg == Msg.HELLO:
                    common = [v for v in body.get("versions", []) if v in SUPPORTED]
                    if not common:
                        sock.sendall(encode(Msg.ERROR, {"message": "no common Link W version"}))
                        return 2
                    try:
                        runtime = _load(args)
                    except Exception as e:
                        sock.sendall(encode(Msg.ERROR, {"message": getattr(e, "message", None) or str(e),
                                                        "code": getattr(e, "code", None)}))
                        return 3
                    kv = _attach_kv_store(runtime, args)
                    sock.sendall(encode(Msg.HELLO_ACK, {"version": VERSION, "info": runtime.info.to_wire(),
                                                        "kv": kv if runtime.kv_store is not None else None}))
                elif msg == Msg.STEP:
                    if runtime is None:
                        raise ProtocolError("STEP before HELLO")
                    plan = StepPlan.from_wire(body)
                    result = runtime.step(plan)
                    sock.sendall(encode(Msg.STEP_RESULT, result.to_wire(), correlation=plan.step))
                elif msg == Msg.SHUTDOWN:
                    return 0
    except Exception as e:
        traceback.print_exc()
        try:
            sock.sendall(encode(Msg.ERROR, {"message": getattr(e, "message", None) or f"{type(e).__name__}: {e}",
                                            "code": getattr(e, "code", None)}))
        except OSError:
            pass
        return 1
    finally:
        if runtime is not None:
            if runtime.kv_store is not None:
                runtime.kv_store.close()  # queued saves reach the disk before the process goes
            runtime.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="superfluid.worker")
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--runtime", default="llamacpp")
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-tokens", type=int, default=256)
    p.add_argument("--pooling", default="", help="llama.cpp embeddings: mean, cls or last (default: the GGUF's)")
    p.add_argument("--stages", default="", help="pipeline runtime: the stage nodes, HOST:PORT,...")
    p.add_argument("--split", default="even", help="pipeline runtime: layers split evenly or by memory")
    p.add_argument("--spares", default="", help="pipeline runtime: stage nodes that stand in for unreachable ones")
    p.add_argument("--kv-dir", default="", help="the disk tier of the KV cache (empty: none)")
    p.add_argument("--kv-disk-mb", type=float, default=0.0, help="most MiB the disk tier holds")
    args = p.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when we stop
    sock = socket.socket(fileno=args.fd)
    try:
        return serve(sock, args)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
