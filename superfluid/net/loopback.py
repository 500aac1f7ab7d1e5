"""Network helpers every layer may use (the bottom layer: standard library only)."""

from __future__ import annotations

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

