"""Proof that whatever listens on 127.0.0.1:PORT is this user's own server, before the CLI
sends it a key (`launch`, `sessions prune`, `top`).

Any local user may listen on a free port: a squatter there would get the admin key and an
agent's whole context, and could answer as the model. So at start the server writes a random
token to <home>/run/serve-PORT.token (mode 0600, in the user's private home) and answers
GET /superfluid/listener?nonce=N with HMAC-SHA256(token, "superfluid-listener N"). The CLI
reads the token, sends a fresh random nonce and checks the answer; only a process that can
read this user's file (the server the user started, or the user) can answer. The token is new
at each start, so a file a crashed server left proves nothing to a squatter that takes its
port. The route needs no key and tells nothing but the HMAC of a nonce the asker chose. A
proxy of the user's own on another port is trusted only if the user copies the server's token
file to the proxy's port's name."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path
from urllib.parse import parse_qs

from ..config import home, private_dir

PROOF_PATH = "/superfluid/listener"
_NONCE = re.compile(r"[0-9a-f]{32,128}")


def token_path(port: int) -> Path:
    return home() / "run" / f"serve-{port}.token"


def write_token(port: int) -> tuple[Path, str]:
    """A fresh token for this server, in a file only this user can read."""
    path = token_path(port)
    private_dir(home())
    private_dir(path.parent)
    token = secrets.token_hex(32)
    path.unlink(missing_ok=True)  # never write through a file (or link) left there
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path, token


def proof(token: str, nonce: str) -> str:
    return hmac.new(token.encode(), f"superfluid-listener {nonce}".encode(), hashlib.sha256).hexdigest()


class Prover:
    """ASGI: answers the proof route before anything else (no key, no log); the rest goes on."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") != PROOF_PATH:
            return await self.app(scope, receive, send)
        nonce = (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("nonce") or [""])[0]
        if scope.get("method") != "GET" or not _NONCE.fullmatch(nonce):
            status, body = 400, b'{"error": {"message": "GET with nonce=32 to 128 lowercase hex digits"}}'
        else:
            status, body = 200, f'{{"proof": "{proof(self.token, nonce)}"}}'.encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": body})


class NotOurs(Exception):
    """The listener on the port could not prove it is this user's server (the reason)."""


class NoListener(NotOurs):
    """Nothing listens on the port."""


class Silent(NotOurs):
    """Something accepts connections on the port but does not answer (a server still loading)."""


def check(port: int, timeout: float = 2.0) -> None:
    """Raises NotOurs unless the listener on 127.0.0.1:`port` proves it holds this user's token
    for the port (NoListener when nothing answers). Sends no key."""
    import httpx
    url = f"http://127.0.0.1:{port}{PROOF_PATH}"
    nonce = secrets.token_hex(16)
    try:
        r = httpx.get(url, params={"nonce": nonce}, timeout=timeout)
    except httpx.ConnectError as e:
        raise NoListener(f"nothing listens on 127.0.0.1:{port} ({e})") from None
    except httpx.HTTPError as e:
        raise Silent(f"the listener on 127.0.0.1:{port} did not answer the proof request ({e})") from None
    try:
        token = token_path(port).read_text().strip()
    except OSError:
        raise NotOurs(f"something listens on 127.0.0.1:{port}, but no server of yours wrote "
                      f"{token_path(port)}: it may be another user's program") from None
    try:
        got = r.json().get("proof") if r.status_code == 200 else None
    except ValueError:
        got = None
    if not isinstance(got, str) or not hmac.compare_digest(got, proof(token, nonce)):
        raise NotOurs(f"the listener on 127.0.0.1:{port} could not prove it is your superfluid server "
                      f"(it does not know the token in {token_path(port)}): another program holds the port")


def is_loopback_target(url: str) -> tuple[bool, int]:
    """(whether an http URL names this machine's loopback, its port)."""
    from urllib.parse import urlsplit
    try:
        u = urlsplit(url)
        port = u.port or 80
    except ValueError:
        return False, 0
    return (u.hostname or "") in ("127.0.0.1", "localhost", "::1"), port
