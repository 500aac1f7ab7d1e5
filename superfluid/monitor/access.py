"""The access log: one line per HTTP request, after its response is done (a stream when
its last byte is sent). Counts and timings only, never the content of prompts or outputs.

Handlers put what they know in the scope's state under "access" (model, class, token
counts, TTFT, finish reason); this middleware adds method, path, status and total time."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson

log = logging.getLogger("superfluid.access")

FIELDS = ("method", "path", "status", "model", "qos", "prompt_tokens", "cached_tokens",
          "completion_tokens", "ttft_s", "prefill_tps", "decode_tps", "total_s", "finish", "error")


MAX_PATH = 256  # a client's path is logged up to this many characters


def shown(path: str) -> str:
    """A client's path as the log shows it: at most MAX_PATH characters, and every character
    that is not printable (a newline that would forge a log line, a terminal escape, a bidi
    override) written as its escape."""
    if len(path) > MAX_PATH:
        path = path[:MAX_PATH] + "…"
    if path.isprintable():
        return path
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in path)


def line(rec: dict, fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps({k: rec[k] for k in FIELDS if rec.get(k) is not None}).decode()
    parts = [f"{rec.get('method')} {rec.get('path')} {rec.get('status')}"]
    for k in FIELDS[3:]:
        v = rec.get(k)
        if v is not None:
            parts.append(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


def derive(rec: dict) -> dict:
    """Prefill and decode rates from counts and timings."""
    ttft, total = rec.get("ttft_s"), rec.get("total_s")
    if ttft:
        rec["prefill_tps"] = round((rec.get("prompt_tokens", 0) - rec.get("cached_tokens", 0)) / ttft, 1)
        n = rec.get("completion_tokens", 0) - 1
        if total and total > ttft and n > 0:
            rec["decode_tps"] = round(n / (total - ttft), 1)
        rec["ttft_s"] = round(ttft, 4)
    return rec


class AccessLog:
    def __init__(self, app, fmt: str = "text", skip: frozenset[str] = frozenset({"/health", "/metrics"}),
                 on_record: Callable[[dict], None] | None = None):
        self.app, self.fmt, self.skip, self.on_record = app, fmt, skip, on_record

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.skip:
            return await self.app(scope, receive, send)
        t0 = time.monotonic()
        rec = scope.setdefault("state", {}).setdefault("access", {})
        path = scope.get("path") or ""
        rec.update(method=scope.get("method"), path=shown(path), status=500)

        async def send_(m):
            if m["type"] == "http.response.start":
                rec["status"] = m["status"]
            await send(m)

        try:
            await self.app(scope, receive, send_)
        finally:
            rec["total_s"] = round(time.monotonic() - t0, 4)
            # what metrics label by: the matched route's template, never a raw path a client
            # makes up (each new one would be a new series, kept forever; a trailing-slash
            # redirect to a templated route took any path). A file the web app serves names
            # itself as its route (a set the app bounds). Without a route: a preflight, which
            # any path gets, is "preflight", a redirect "redirect", anything else "unmatched".
            route = getattr(scope.get("route"), "path", None)
            if not isinstance(route, str):
                status = rec.get("status", 500)
                route = ("preflight" if status < 300 and scope.get("method") == "OPTIONS"
                         else "redirect" if 300 <= status < 400 else "unmatched")
            rec["route"] = route
            log.info(line(derive(rec), self.fmt))
            if self.on_record is not None:
                self.on_record(rec)
