"""transport.Tunnels: byte streams carried over one link (RPC_OPEN / DATA / ACK / CLOSE),
between two Links over a socketpair and real loopback TCP connections on each end: bytes
arrive intact and in order past many windows, an end that closes closes the other, and a
peer that sends past its window loses the link instead of growing our memory."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from superfluid.errors import ProtocolError
from superfluid.link import messages as m
from superfluid.net.transport import WINDOW, Link, Tunnels


async def echo_server() -> asyncio.Server:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(1 << 16):
            w.write(data)
            await w.drain()
        w.close()
    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def pair():
    """A head end (a local listener whose connections are tunnelled) and a node end (streams
    handed to an echo server), over one link."""
    a, b = socket.socketpair()
    head, node = await Link.over(a, m.LINK_F), await Link.over(b, m.LINK_F)
    th, tn = Tunnels(head), Tunnels(node)
    echo = await echo_server()
    port = echo.sockets[0].getsockname()[1]

    async def node_handler(kind, body):
        if kind == m.RPC_OPEN:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            tn.attach(body.stream, r, w)
        else:
            tn.on_message(kind, body)
    sids = iter(range(1, 100))

    def on_local(r, w):
        sid = next(sids)
        head.send(m.RpcOpen(sid))
        th.attach(sid, r, w)
    local = await asyncio.start_server(on_local, "127.0.0.1", 0)
    tasks = [asyncio.ensure_future(node.serve(node_handler)), asyncio.ensure_future(head.serve(th.on_message))]
    return head, node, th, tn, local.sockets[0].getsockname()[1], tasks, (echo, local)


def test_bytes_cross_intact_past_many_windows_and_a_close_closes_the_other_end():
    async def go():
        head, node, th, tn, port, tasks, servers = await pair()
        payload = os.urandom(3 * WINDOW + 12345)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(payload)
        got = await asyncio.wait_for(r.readexactly(len(payload)), 60)
        assert got == payload
        assert th.bytes_out == tn.bytes_in == len(payload) == tn.bytes_out == th.bytes_in
        w.close()  # the node's end closes too, and both forget the stream
        for _ in range(100):
            if not th.streams and not tn.streams:
                break
            await asyncio.sleep(0.02)
        assert not th.streams and not tn.streams
        for t in tasks:
            t.cancel()
        for s in servers:
            s.close()
    asyncio.run(go())


def test_a_peer_that_sends_past_its_window_is_a_protocol_error():
    """Bytes the local side has not taken yet count against the window: a peer that keeps
    sending without acknowledgements is refused, not buffered."""
    async def go():
        a, b = socket.socketpair()
        node = await Link.over(b, m.LINK_F)
        tn = Tunnels(node)
        stalled = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # never reads
        r, w = await asyncio.open_connection("127.0.0.1", stalled.sockets[0].getsockname()[1])
        tn.attach(1, r, w)
        chunk = m.RpcData(1, bytes(1 << 20))
        for _ in range(WINDOW >> 20):
            assert tn.on_message(m.RPC_DATA, chunk)  # within the window: taken
        with pytest.raises(ProtocolError, match="window"):
            tn.on_message(m.RPC_DATA, chunk)
        tn.close()
        stalled.close()
        a.close()
    asyncio.run(go())
