"""The CLI sends a key only to this user's own server (issue 54, item 4): `launch`,
`sessions prune` and `top` sent `Authorization: Bearer <admin key>` to whatever listened on
127.0.0.1:PORT, and a squatter there took the key and the agent's context. A plain socket
server on the port (answering every request as a server would, a proof included) never
receives the key, and the CLI says why it refused; the real proof (api/listener.Prover behind
uvicorn, the token in <home>/run) passes."""

import json
import os
import socket
import stat
import threading
import time

import pytest
import uvicorn

from superfluid.api import listener
from superfluid.cli.main import main

KEY = "sk-admin-squatted-0123456789"


class Squatter:
    """Listens on a free loopback port; records every byte it is sent; answers every request
    with 200 and a body that looks like a server's (a made-up proof, a model list)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen = b""
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                except OSError:
                    pass
                self.seen += data
                self.requests += 1
                body = json.dumps({"proof": "0" * 64, "data": [{"id": "evil", "meta": {"n_ctx": 99999}}],
                                   "erased": 0}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)

    def close(self):
        self.sock.close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPERFLUID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SUPERFLUID_API_KEY", KEY)
    return tmp_path / "home"


@pytest.fixture
def squatter():
    s = Squatter()
    yield s
    s.close()


@pytest.mark.parametrize("stale_token", [False, True], ids=["no-token-file", "stale-token-file"])
def test_a_squatter_on_the_port_never_gets_the_key(home, squatter, tmp_path, monkeypatch, capsys, stale_token):
    if stale_token:  # a crashed server of ours left its token: the squatter still cannot answer
        listener.write_token(squatter.port)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ollama").write_text("#!/bin/sh\nexit 0\n")
    (fake / "ollama").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ.get('PATH', '')}")

    assert main(["sessions", "prune", "--port", str(squatter.port), "--api-key", KEY]) == 1
    err = capsys.readouterr().err
    assert "the key was not sent" in err and ("could not prove" in err or "no server of yours" in err), err

    assert main(["launch", "ollama", "--port", str(squatter.port), "--api-key", KEY]) == 1
    err = capsys.readouterr().err
    assert "were not sent to it" in err and "starting" not in err, err

    assert main(["top", "--once", "--interval", "0.1", "--api-key", KEY, f"127.0.0.1:{squatter.port}"]) == 0
    assert "not yours" in capsys.readouterr().out

    assert squatter.requests >= 3  # it was asked for a proof, each time
    assert KEY.encode() not in squatter.seen and b"authorization" not in squatter.seen.lower()


def test_the_servers_own_proof_passes_and_its_token_file_is_private(home):
    path, token = listener.write_token(0)  # written before the port is known here: renamed below
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    path.rename(listener.token_path(port))
    assert stat.S_IMODE(os.stat(listener.token_path(port)).st_mode) == 0o600

    async def app(scope, receive, send):  # the rest of the server: never reached by the proof
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})
    server = uvicorn.Server(uvicorn.Config(listener.Prover(app, token), log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        listener.check(port)  # proven
        listener.write_token(port)  # a new server's token: the old one no longer proves anything
        with pytest.raises(listener.NotOurs, match="could not prove"):
            listener.check(port)
    finally:
        server.should_exit = True
        t.join(5)
    with pytest.raises(listener.NoListener):
        listener.check(port)
