"""Network helpers every layer may use (the bottom layer: standard library only)."""

from __future__ import annotations

import asyncio
import ipaddress


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name or address, with or without a port; IPv6 in brackets) names
    this machine's loopback: `localhost`, `*.localhost`, 127.0.0.0/8 or ::1."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.split(":")[0]
    if host in ("localhost", "localhost.") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for a relay on a latency-critical path (llama.cpp RPC through Link F:
    a few round trips per token): uvloop's when installed (it comes with uvicorn[standard],
    which the daemon runs on), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
