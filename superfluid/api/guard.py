"""The HTTP front door, as ASGI middleware: browser-borne requests (a foreign Origin, a
rebound Host), API keys and their policies, per-key and per-IP rate limits, concurrency.
`/health` is always open. Denials are OpenAI-style error bodies; 429s carry Retry-After."""

from __future__ import annotations

import math
import time
from collections import deque
from urllib.parse import urlsplit

import orjson

from ..net import is_loopback_host
from ..request import Qos
from .policy import KeyPolicy, find_key

OPEN_PATHS = {"/health"}
WINDOW_S = 60.0


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


class Guard:
    def __init__(self, app, *, policies: list[KeyPolicy], loopback_bind: bool,
                 ip_rpm: int | None = None, clock=time.monotonic):
        self.app = app
        self.policies = policies
        self.loopback_bind = loopback_bind
        self.ip_rpm = ip_rpm
        self.clock = clock
        self._key_windows: dict[str, _Window] = {}
        self._ip_windows: dict[str, _Window] = {}
        self._active: dict[str, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        denied = self._browser_check(headers)
        if denied:
            return await _deny_in(scope, send, 403, denied, "forbidden")
        if scope.get("path") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        now = self.clock()
        ip = (scope.get("client") or ("?", 0))[0]
        if self.ip_rpm:
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
            if policy.max_concurrent and self._active.get(policy.name, 0) >= policy.max_concurrent:
                return await _deny_in(scope, send, 429, f"key '{policy.name}' already has {policy.max_concurrent} "
                                   "requests running", "concurrency_limit_exceeded", 1.0)
            scope.setdefault("state", {})["key"] = policy
        if policy is None or not policy.max_concurrent:
            return await self.app(scope, receive, send)
        self._active[policy.name] = self._active.get(policy.name, 0) + 1
        try:  # a stream holds its slot until its last byte is sent
            await self.app(scope, receive, send)
        finally:
            self._active[policy.name] -= 1

    def _browser_check(self, headers: dict[str, str]) -> str | None:
        origin = headers.get("origin")
        if origin and origin != "null":
            host = urlsplit(origin).hostname or ""
            if not is_loopback_host(host):
                return f"cross-origin requests are refused (Origin {origin})"
        if self.loopback_bind and "host" in headers and not is_loopback_host(headers["host"]):
            return f"Host {headers['host']!r} is not this loopback server (DNS rebinding?)"
        return None

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
    kind = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}[status]
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
