"""The HTTP front door, as ASGI middleware: browser-borne requests (CORS for loopback pages
and `--cors-origins`, or for any page when API keys guard the server and no --cors-origins
narrows it; `Origin: null` and the rest refused; a rebound Host; simple
content types on a browser's state-changing request), repeated control headers, API keys
and their policies, per-key and per-IP rate limits, concurrency. `/health` and `/` are always
open: /health's details need a key when there are keys, and `/` is Ollama's liveness probe
to a client that does not ask for the page (which is served without a key too, as
llama-server serves its own). Denials are OpenAI-style error bodies; 429s carry Retry-After."""

from __future__ import annotations

import ipaddress
import math
import re
import socket
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

import orjson

from ..net.loopback import is_loopback_host
from ..request import Qos
from ..service.registry import LOADS_REFUSED
from . import cache_ns
from .policy import KeyPolicy, find_key

OPEN_PATHS = {"/health", "/"}  # a status, and Ollama's "Ollama is running" (the page is ui.py's)
WINDOW_S = 60.0
MAX_IP_WINDOWS = 4096  # per-client windows kept before the idle ones are pruned
# a header that says who the caller is or how to treat it must come once: a repeated one would
# be read one way here and another way by the app
SINGLE = ("authorization", "x-api-key", "x-superfluid-qos", "origin", "host", "content-type", "last-event-id")
CHANGES = {"POST", "PUT", "PATCH", "DELETE"}
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
ALLOW_HEADERS = "authorization, content-type, x-api-key, x-superfluid-qos, last-event-id"
ALLOW_METHODS = b"GET, POST, PATCH, DELETE, OPTIONS"
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")  # a header name (RFC 9110 token)
EXPOSE_HEADERS = b"x-superfluid-session, retry-after"


class _Window:
    """Request timestamps within the last minute, for a requests-per-minute limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.times: deque[float] = deque()

    def admit(self, now: float) -> float:
        """0 if admitted (and counted), else seconds until a slot frees."""
        while self.times and now - self.times[0] >= WINDOW_S:
            self.times.popleft()
        if len(self.times) >= self.limit:
            return WINDOW_S - (now - self.times[0])
        self.times.append(now)
        return 0.0


class Slots:
    """A key's background responses: each holds one of the key's max_concurrent slots until it
    ends, for new generation requests; polling, streaming or cancelling one stays open."""

    def __init__(self, running: dict[str, int], name: str):
        self.running, self.name = running, name

    def hold(self) -> Callable[[], None]:
        """Take a slot; the returned function gives it back (once, however often called)."""
        self.running[self.name] = self.running.get(self.name, 0) + 1
        held = [True]

        def release() -> None:
            if held:
                held.clear()
                self.running[self.name] -= 1
        return release


class Guard:
    def __init__(self, app, *, policies: list[KeyPolicy], loopback_bind: bool,
                 ip_rpm: int | None = None, clock=time.monotonic, cors_origins: tuple[str, ...] = (),
                 cache_isolation: bool = True, lan_names: frozenset[str] | None = None):
        self.app = app
        self.lan_names = lan_names  # a keyless server on the network: the names it answers (lan_names())
        self.policies = policies
        self.cache_isolation = cache_isolation  # each key its own prefix-cache namespace (api/cache_ns.py)
        self.loopback_bind = loopback_bind
        self.ip_rpm = ip_rpm
        # `localhost` is llama-server's word for loopback pages, which are always let in here
        self.cors_origins = {o.rstrip("/").lower() for o in cors_origins} - {"localhost"}
        # with keys, a foreign page can do nothing without one the user gave it (the key is a
        # header, never ambient: no cookies, no Basic auth), so any page may ask, as
        # llama-server's default; --cors-origins (even `localhost`) narrows it again
        self.any_origin = bool(policies) and not cors_origins
        self.clock = clock
        self._key_windows: dict[str, _Window] = {}
        self._ip_windows: dict[str, _Window] = {}
        self._active: dict[str, int] = {}
        self._background: dict[str, int] = {}  # background responses running, by key name (Slots)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # who may load a model the request names (service/registry.Models.get reads it)
        token = LOADS_REFUSED.set("a GET request never loads one" if scope.get("method") in ("GET", "HEAD")
                                  else "only an admin key may load one" if self.policies else None)
        try:
            return await self._guarded(scope, receive, send)
        finally:
            LOADS_REFUSED.reset(token)

    async def _guarded(self, scope, receive, send):
        names = [k.decode("latin-1").lower() for k, _ in scope.get("headers", [])]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        twice = sorted({n for n in names if n in SINGLE and names.count(n) > 1})
        if twice:
            return await _deny_in(scope, send, 400, f"the header {twice[0]} must be sent once", "duplicate_header")
        denied = self._host_check(headers)
        if denied:
            return await _deny_in(scope, send, 403, denied, "forbidden")
        origin = headers.get("origin")
        if origin is not None:
            granted = self._allowed(origin, headers.get("host", ""))
            if scope.get("method") == "OPTIONS" and "access-control-request-method" in headers:
                if not granted:  # a 2xx without a grant: the browser sends nothing more (as llama-server)
                    scope.setdefault("state", {}).setdefault("access", {})["error"] = "origin_refused"
                return await _preflight(send, origin if granted else None, headers)
            if not granted:
                return await _deny_in(scope, send, 403, f"cross-origin requests are refused (Origin {origin}); "
                                      "--cors-origins lets a page in", "forbidden")
            send = _with_cors(send, origin)
            if scope.get("method") in CHANGES and headers.get("content-type", "").split(";")[0].strip().lower() \
                    in SIMPLE_TYPES:
                return await _deny_in(scope, send, 415, "a browser's request that changes something must send "
                                      "application/json", "unsupported_media_type")
        if scope.get("path") in OPEN_PATHS:
            if self.policies:  # the details need a key; the status does not
                presented = _presented_key(headers)
                key = find_key(self.policies, presented) if presented else None
                if key is not None:
                    scope.setdefault("state", {})["key"] = key
                scope.setdefault("state", {})["keys_required"] = True
            return await self.app(scope, receive, send)
        now = self.clock()
        ip = (scope.get("client") or ("?", 0))[0]
        if self.ip_rpm:
            if len(self._ip_windows) > MAX_IP_WINDOWS:
                self._ip_windows = {k: w for k, w in self._ip_windows.items()
                                    if w.times and now - w.times[-1] < WINDOW_S}
            wait = self._ip_windows.setdefault(ip, _Window(self.ip_rpm)).admit(now)
            if wait:
                return await _deny_in(scope, send, 429, f"rate limit: {self.ip_rpm} requests per minute per client",
                                   "rate_limit_exceeded", wait)
        policy = None
        if self.policies:
            presented = _presented_key(headers)
            policy = find_key(self.policies, presented) if presented else None
            if policy is None:
                return await _deny_in(scope, send, 401, "a valid API key is required (Authorization: Bearer KEY "
                                   "or x-api-key: KEY)", "invalid_api_key")
            denied = self._qos_check(policy, headers)
            if denied:
                return await _deny_in(scope, send, 403, denied, "qos_not_allowed")
            if policy.rpm:
                wait = self._key_windows.setdefault(policy.name, _Window(policy.rpm)).admit(now)
                if wait:
                    return await _deny_in(scope, send, 429, f"rate limit: key '{policy.name}' may make {policy.rpm} "
                                       "requests per minute", "rate_limit_exceeded", wait)
            running = self._active.get(policy.name, 0)
            if scope.get("method") == "POST" and not scope.get("path", "").endswith("/cancel"):
                running += self._background.get(policy.name, 0)  # what may start a generation
            if policy.max_concurrent and running >= policy.max_concurrent:
                return await _deny_in(scope, send, 429, f"key '{policy.name}' already has {policy.max_concurrent} "
                                   "requests running", "concurrency_limit_exceeded", 1.0)
            scope.setdefault("state", {})["key"] = policy
            if self.cache_isolation and not policy.admin:
                scope["state"][cache_ns.STATE] = cache_ns.of_key(policy.name)
            if policy.admin and scope.get("method") not in ("GET", "HEAD"):
                LOADS_REFUSED.set(None)
            if policy.max_concurrent:
                scope["state"]["slots"] = Slots(self._background, policy.name)
        if policy is None or not policy.max_concurrent:
            return await self.app(scope, receive, send)
        self._active[policy.name] = self._active.get(policy.name, 0) + 1
        try:  # a stream holds its slot until its last byte is sent
            await self.app(scope, receive, send)
        finally:
            self._active[policy.name] -= 1

    def _host_check(self, headers: dict[str, str]) -> str | None:
        """DNS rebinding: a page whose own name the attacker points at this server gets its
        answers as same-origin. A loopback server answers only loopback names and addresses;
        a keyless one on the network only IP literals, loopback and its own names (one with
        keys needs no Host rule: a page cannot send a key it was not given)."""
        if "host" not in headers:
            return None
        host = headers["host"]
        if self.loopback_bind and not is_loopback_host(host):
            return f"Host {host!r} is not this loopback server (DNS rebinding?)"
        if self.lan_names is not None and not _lan_host(host, self.lan_names):
            return (f"Host {host!r} is not this server's address or name (DNS rebinding?): a server on the "
                    "network without API keys answers IP addresses, localhost and its own names only")
        return None

    def _allowed(self, origin: str, host: str) -> bool:
        """This server's own pages (same origin), a page on this machine (any loopback origin),
        one --cors-origins names, or with keys and no --cors-origins any page; never `null` (a
        sandboxed frame, a file, a redirect)."""
        if origin.rstrip("/").lower() in self.cors_origins:
            return True
        if origin == "null":
            return False
        if self.any_origin:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https"):
            return False
        return is_loopback_host(parts.hostname or "") or (bool(host) and parts.netloc.lower() == host.lower())

    @staticmethod
    def _qos_check(policy: KeyPolicy, headers: dict[str, str]) -> str | None:
        raw = headers.get("x-superfluid-qos")
        if raw is None:
            return None
        raw = raw.strip().lower()
        try:
            asked = Qos(int(raw)) if raw.isdigit() else Qos[raw.upper()]
        except (KeyError, ValueError):
            return None  # the API answers 400 for an unknown class
        if asked.rank < policy.max_qos.rank:
            return (f"key '{policy.name}' may ask for QoS class {policy.max_qos.name.lower()} at best, "
                    f"not {asked.name.lower()}")
        return None


def lan_names(bind_host: str) -> frozenset[str]:
    """The names a keyless server bound to `bind_host` (not loopback) answers besides IP
    literals and loopback: the bind address when it is a name, and this machine's hostname
    (as given, its first label, and that .local, as mDNS names it)."""
    names = {bind_host.strip().lower().rstrip(".")}
    host = socket.gethostname().strip().lower().rstrip(".")
    if host:
        names |= {host, host.split(".")[0], host.split(".")[0] + ".local"}
    return frozenset(n for n in names if n)


def _lan_host(host: str, names: frozenset[str]) -> bool:
    """Whether a Host header (with or without a port) is an IP literal, loopback or one of `names`."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.split(":")[0]
    if is_loopback_host(name):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name.rstrip(".") in names


def _with_cors(send, origin: str):
    """Responses to an allowed page say so (the origin reflected, as llama-server does)."""
    async def wrapped(message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                               (b"access-control-allow-origin", origin.encode("latin-1")),
                                               (b"access-control-allow-credentials", b"true"),
                                               (b"access-control-expose-headers", EXPOSE_HEADERS),
                                               (b"vary", b"origin")]}
        await send(message)
    return wrapped


async def _preflight(send, origin: str | None, headers: dict[str, str]) -> None:
    """A preflight's answer: 200 (any 2xx will do; llama-server's clients check for 200) with the
    grant for an allowed `origin`: the headers the page asked for (an SDK's anthropic-version,
    x-stainless-*), else the ones this API reads. None: no grant, so the browser stops there."""
    out = [(b"vary", b"origin, access-control-request-method, access-control-request-headers"),
           (b"content-length", b"0")]
    if origin is not None:
        asked = [h.strip() for h in headers.get("access-control-request-headers", "").lower().split(",")]
        allow = ", ".join(h for h in asked if TOKEN.fullmatch(h)) or ALLOW_HEADERS
        out += [(b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-allow-methods", ALLOW_METHODS),
                (b"access-control-allow-headers", allow.encode("latin-1")),
                (b"access-control-allow-credentials", b"true"), (b"access-control-max-age", b"600")]
    await send({"type": "http.response.start", "status": 200, "headers": out})
    await send({"type": "http.response.body", "body": b""})


async def _deny_in(scope, send, status: int, message: str, code: str, retry_after: float | None = None) -> None:
    await _deny(send, status, message, code, retry_after, scope)


def _presented_key(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")


async def _deny(send, status: int, message: str, code: str, retry_after: float | None = None,
                scope: dict | None = None) -> None:
    if scope is not None:
        scope.setdefault("state", {}).setdefault("access", {})["error"] = code
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            415: "invalid_request_error", 429: "rate_limit_error"}[status]
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def pull_refused(request) -> str | None:
    """Why this request may not start a pull from the hub (None: it may). A model load's rule
    first (a GET never; with keys, only an admin key); on a server without keys, only a client
    on this machine, and of browser pages only a loopback one by the CORS rule's loopback test
    (not a page --cors-origins lets in, not a LAN client's)."""
    why = LOADS_REFUSED.get()
    if why is not None:
        return why
    if request.scope.get("state", {}).get("key") is not None:  # an admin key (there are keys)
        return None
    peer = (request.scope.get("client") or ("", 0))[0]
    if not is_loopback_host(peer or ""):
        return "on a server without API keys only a client on this machine may pull one"
    origin = request.headers.get("origin")
    if origin is not None and not is_loopback_host(urlsplit(origin).hostname or ""):
        return f"on a server without API keys only a page on this machine may pull one (not {origin})"
    return None
