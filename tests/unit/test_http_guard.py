"""net/http.py on a real loopback socket under uvicorn (in a thread, a small ASGI app): a
client that trickles its headers is closed at the header deadline, on its first request and on
a kept-alive connection's next one; a long streamed answer is not; past the connection cap a
new connection gets a 503 and is closed."""

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from superfluid.net.http import protocol


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    if scope["path"] == "/slow":  # streams for longer than the header deadline
        for _ in range(6):
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            await asyncio.sleep(0.25)
    await send({"type": "http.response.body", "body": b"done"})


@pytest.fixture
def server():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    cfg = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_keep_alive=60,
                         http=protocol(max_connections=3, header_timeout=0.5))
    srv = uvicorn.Server(cfg)
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    srv.should_exit = True
    t.join(5)


def connect(port: int) -> socket.socket:
    c = socket.create_connection(("127.0.0.1", port))
    c.settimeout(10)
    return c


def closed_while_trickling(c: socket.socket) -> bool:
    """Send a header line's bytes one at a time, 0.1 s apart, for up to 5 s: whether the
    server closed the connection meanwhile."""
    for b in b"X-Trickle: " + b"a" * 50:
        try:
            c.sendall(bytes([b]))
        except (BrokenPipeError, ConnectionResetError):
            return True
        c.settimeout(0.1)
        try:
            if c.recv(4096) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionResetError:
            return True
    return False


def response(c: socket.socket) -> bytes:
    data = b""
    c.settimeout(10)
    while not data.endswith(b"done") and not data.endswith(b"\r\n0\r\n\r\n"):
        chunk = c.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_trickled_headers_are_cut_at_the_deadline(server):
    c = connect(server)
    c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert closed_while_trickling(c)


def test_a_kept_alive_connection_gets_the_deadline_for_its_next_request(server):
    c = connect(server)
    c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert response(c).startswith(b"HTTP/1.1 200")
    c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # a prompt second request is answered
    assert response(c).startswith(b"HTTP/1.1 200")
    c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert closed_while_trickling(c)


def test_a_long_stream_is_not_cut(server):
    c = connect(server)
    c.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    data = response(c)
    assert data.startswith(b"HTTP/1.1 200") and b"done" in data  # 1.5 s, past the 0.5 s deadline


def test_connections_past_the_cap_get_a_503(server):
    held = [connect(server) for _ in range(3)]
    extra = connect(server)
    data = extra.recv(4096)
    assert data.startswith(b"HTTP/1.1 503") and b"too_many_connections" in data
    assert extra.recv(4096) == b""  # and closed
    for c in held:
        c.close()
    time.sleep(0.2)
    c = connect(server)  # room again
    c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert response(c).startswith(b"HTTP/1.1 200")
