"""A llama.cpp RPC node (`superfluid node serve --rpc`): this host's CPU and memory for a
head that splits a GGUF by layers across machines (`serve --rpc-nodes`), on llama.cpp's own
RPC engine, so the weights stay quantized and every llama.cpp kernel runs.

ggml's RPC protocol has no authentication, so its server is reachable only through Link F:
it runs in a child process in a network namespace of its own (runtime/rpc_jail.py), whose
loopback no other process shares, and this process gets each connection to it from the child
as a file descriptor. Where the system refuses the namespaces, it runs on a thread of this
process, bound to the host's 127.0.0.1 (which other local users can reach: a warning says
so). A head (its worker: runtime/rpc_link.py) sends RPC_OPEN for each connection its
llama.cpp makes; the stream's bytes (transport.Tunnels) go to a connection to the server. Tensors of
over 10 MiB are kept under `<home>/rpc-cache` by hash, so a restarted node is not sent them
again. HELLO_ACK and NODE_STATUS carry `rpc`: free and total memory, threads, bytes received
and open streams."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from typing import Any

from ..link import messages as m
from ..runtime import rpc
from ..runtime.rpc_jail import JailUnavailable, RpcJail
from ..net.loopback import listener_is_ours
from ..net.transport import Tunnels
from .node import NodeServer, _Head

log = logging.getLogger("superfluid.node")

START_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcNodeServer(NodeServer):
    REDIAL_MAX = 1.0  # a head's new worker (a reload) waits for its joined nodes about this long

    def __init__(self, psk: bytes | None, cache_dir: str, *, threads: int = 1, node_id: str | None = None,
                 lease_s: float = 10.0):
        super().__init__(None, psk, node_id=node_id, lease_s=lease_s)
        rpc.library()  # RpcUnavailable (with the rebuild command) before anything listens
        self.threads, self.cache_dir = threads, cache_dir
        self._tunnels: dict[_Head, Tunnels] = {}
        self._bytes_in = 0  # from heads that have gone
        self.jail: RpcJail | None = None
        self._closing = False
        self.rpc_port = 0
        try:
            self.jail = RpcJail(cache_dir, threads)
            threading.Thread(target=self._watch_jail, name="rpc-jail", daemon=True).start()
            return
        except JailUnavailable as e:
            log.warning("ggml's RPC server runs on this host's 127.0.0.1, where other local users can reach it: "
                        "it could not be given a network namespace of its own (%s)", e)
        self.rpc_port = free_port()
        threading.Thread(target=rpc.serve, args=(self.rpc_port, cache_dir, threads), name="ggml-rpc",
                         daemon=True).start()
        self._wait_listening()
        if listener_is_ours(self.rpc_port) is False:  # Link F would carry a head's tensors to it
            raise rpc.RpcUnavailable(f"another process took 127.0.0.1:{self.rpc_port} before ggml's RPC server could "
                                     "bind it; start the node again")

    def _watch_jail(self) -> None:
        """ggml aborts its process when it cannot go on: as the server on a thread of this
        process would take the node down with it, so does the jailed one."""
        assert self.jail is not None
        code = self.jail.proc.wait()
        if not self._closing:
            log.error("ggml's RPC server ended (exit %s): the node stops", code)
            logging.shutdown()
            os._exit(70)

    def close(self) -> None:
        self._closing = True
        super().close()
        if self.jail is not None:
            self.jail.close()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.rpc_port), timeout=1.0):
                    return  # (ggml's server drops a connection that never says hello)
            except OSError:
                if time.monotonic() > deadline:
                    raise rpc.RpcUnavailable(f"ggml's RPC server did not listen on 127.0.0.1:{self.rpc_port}") from None
                time.sleep(0.05)

    def offer(self) -> dict:
        free, total = rpc.memory(rpc.cpu_device())
        # in steps of 64 MiB: NODE_STATUS goes out when the status changes, not at every page
        return {"free": free >> 26 << 26, "total": total, "threads": self.threads}

    def hello_ack(self) -> m.HelloAck:
        return m.HelloAck(m.VERSION, self.node_id, (), m.NodeStatus(**self.status()), rpc=self.offer())

    def status(self) -> dict:
        carried = self._bytes_in + sum(t.bytes_in for t in self._tunnels.values())
        streams = sum(len(t.streams) for t in self._tunnels.values())
        return {"lanes": 0, "running": 0, "waiting": 0, "kv_used": 0, "kv_total": 0,
                "rpc": {**self.offer(), "bytes_in": carried, "streams": streams}}

    def _send_prefixes(self, link) -> None:
        """No KV here to place prompts by."""

    def _on_message(self, head: _Head, kind: int, body: Any):
        tunnels = self._tunnels.get(head)
        if tunnels is None:
            tunnels = self._tunnels[head] = Tunnels(head.link)
        if kind == m.RPC_OPEN:
            return self._open(tunnels, body.stream)  # awaited before the next message is read
        tunnels.on_message(kind, body)  # the rest of Link F's commands mean nothing here
        return None

    async def _open(self, tunnels: Tunnels, sid: int) -> None:
        try:
            if self.jail is not None:
                reader, writer = await asyncio.open_connection(sock=await asyncio.to_thread(self.jail.connect))
            else:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.rpc_port)
        except OSError as e:
            tunnels.link.send(m.RpcClose(sid, f"the RPC server is not answering ({e.strerror or e})"))
            return
        try:
            tunnels.attach(sid, reader, writer)
        except Exception:
            writer.close()
            raise

    def head_gone(self, head: _Head) -> None:
        """Its connections to the server close, so the server serves the next head."""
        tunnels = self._tunnels.pop(head, None)
        if tunnels is not None:
            self._bytes_in += tunnels.bytes_in
            tunnels.close()
