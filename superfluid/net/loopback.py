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



def listener_is_ours(port: int) -> bool | None:
    """Whether the socket listening on 127.0.0.1:`port` belongs to this process: a server
    started on a port picked beforehand may find another local user's listener there (it took
    the port first), and a check that it answers would not tell. None where the system has no
    /proc/net/tcp to read (not Linux)."""
    import os
    try:
        with open("/proc/net/tcp") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return None
    want = {f"0100007F:{port:04X}", f"7F000001:{port:04X}"}  # the address in host byte order
    inodes = {cols[9] for cols in (r.split() for r in rows) if len(cols) > 9 and cols[1] in want and cols[3] == "0A"}
    if not inodes:
        return False
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    mine = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    return bool(inodes & mine)
