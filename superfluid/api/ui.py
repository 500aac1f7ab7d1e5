"""The web app: the chat page at `/`, the engine view at `/monitor`, their static files
under `/ui/`, the app's manifest and service worker at the root (`/manifest.webmanifest`,
`/sw.js`: a worker's scope is its folder), `/_app/version.json` (the version, where
llama-server's web app looks), and `GET /v1/monitor`, the engine readings the monitor page
polls.

The pages are files inside the package (superfluid/web), served as they are. They hold no
data, so they are served without an API key (a browser cannot send a header when it
navigates) but with the Guard's Origin/Host checks; every request the pages make goes to
the guarded API with the key as a header. Each page is sent with a strict
Content-Security-Policy: scripts and styles from this origin only, no inline script, no
eval, no remote images, no framing."""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from importlib.resources import files

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from .. import __version__
from ..engine import monitor_record
from ..errors import Forbidden
from ..net.logline import OneLine
from .guard import Guard

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY"),
           (b"cross-origin-opener-policy", b"same-origin"), (b"cache-control", b"no-cache")]
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".mjs":
         "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml",
         ".png": "image/png", ".json": "application/json", ".txt": "text/plain; charset=utf-8",
         ".md": "text/plain; charset=utf-8", ".LICENSE": "text/plain; charset=utf-8",
         ".webmanifest": "application/manifest+json"}
PAGES = {"/": "index.html", "/monitor": "monitor.html", "/sw.js": "sw.js",
         "/manifest.webmanifest": "manifest.webmanifest"}
LOG_LINES = 50


def _suffix(name: str) -> str:
    return name[name.rfind("."):] if "." in name else ""


def load_files() -> dict[str, tuple[bytes, str, str]]:
    """URL path -> (body, content type, etag) for every servable file of superfluid/web."""
    root = files("superfluid.web")
    out: dict[str, tuple[bytes, str, str]] = {}

    def walk(node, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                if not child.name.startswith(("_", ".")):
                    walk(child, f"{prefix}{child.name}/")
                continue
            kind = TYPES.get(_suffix(child.name))
            if kind is None:
                continue
            body = child.read_bytes()
            out[f"/ui/{prefix}{child.name}"] = (body, kind, f'"{hashlib.sha256(body).hexdigest()[:16]}"')

    walk(root, "")
    for path, name in PAGES.items():
        out[path] = out[f"/ui/{name}"]
    version = orjson.dumps({"version": __version__})
    out["/_app/version.json"] = (version, TYPES[".json"], f'"{hashlib.sha256(version).hexdigest()[:16]}"')
    return out


class _File:
    """A served file as the route the access log labels metrics by (scope["route"].path)."""

    def __init__(self, path: str):
        self.path = path


class UiFront:
    """ASGI: the UI's files (GET/HEAD, no key, Origin/Host checked), everything else to the
    guarded API app."""

    def __init__(self, api, *, loopback_bind: bool, lan_names: frozenset[str] | None = None):
        self.api = api
        self.files = load_files()
        self.static = Guard(self._serve, policies=[], loopback_bind=loopback_bind, lan_names=lan_names)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path") in self.files and _wants_page(scope):
            scope["route"] = _File(scope["path"])  # the metrics' label: one of the app's own files
            return await self.static(scope, receive, send)
        return await self.api(scope, receive, send)

    async def _serve(self, scope, receive, send) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            return await _plain(send, 405, b"method not allowed", [(b"allow", b"GET, HEAD")])
        body, kind, etag = self.files[scope["path"]]
        headers = dict(scope.get("headers", []))
        if headers.get(b"if-none-match", b"").decode("latin-1") == etag:
            return await _plain(send, 304, b"", [(b"etag", etag.encode())])
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", kind.encode()), (b"content-length", str(len(body)).encode()),
            (b"etag", etag.encode()), *HEADERS]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


def _wants_page(scope) -> bool:
    """`/` is the chat page for a browser (Accept: text/html) and Ollama's "Ollama is
    running" for its clients, which probe it without asking for HTML."""
    if scope.get("path") != "/":
        return True
    accept = next((v for k, v in scope.get("headers", []) if k == b"accept"), b"")
    return b"text/html" in accept


async def _plain(send, status: int, body: bytes, extra: list) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *extra, *HEADERS]})
    await send({"type": "http.response.body", "body": body})


class LogTail(logging.Handler):
    """The last log lines of the daemon, for the monitor page's log pane."""

    def __init__(self, n: int = LOG_LINES):
        super().__init__()
        self.lines: deque[str] = deque(maxlen=n)
        self.setFormatter(OneLine("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def engine_record(mid: str, eng) -> dict:
    """One engine's readings, from its stats() alone (engine/readings.py): what the terminal
    monitor and /metrics read. Rates are left to the reader: counters are monotonic, as in
    `superfluid top`."""
    return {**monitor_record(eng.stats()), "model": mid}


def add_routes(app: FastAPI, models, tail: LogTail) -> None:
    @app.get("/v1/monitor")
    async def monitor(request: Request):
        key = request.scope.get("state", {}).get("key")
        if key is not None and not key.admin:  # every key's traffic and the daemon's log: as /metrics
            raise Forbidden(f"key '{key.name}' is not an admin key")
        return Response(orjson.dumps({"object": "monitor", "default": models.default,
                                      "models": [engine_record(mid, eng) for mid, eng in models.engines.items()],
                                      "log": list(tail.lines)}), media_type="application/json")


def install(app: FastAPI, models, api, *, loopback_bind: bool, lan_names: frozenset[str] | None = None) -> UiFront:
    """Add the monitor endpoint to `app` and put the pages in front of the guarded `api`."""
    tail = LogTail()
    logger = logging.getLogger("superfluid")
    for h in [h for h in logger.handlers if isinstance(h, LogTail)]:
        logger.removeHandler(h)  # one tail per process (tests build several apps)
    logger.addHandler(tail)
    add_routes(app, models, tail)
    return UiFront(api, loopback_bind=loopback_bind, lan_names=lan_names)
