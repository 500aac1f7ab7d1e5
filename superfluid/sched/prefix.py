"""Token-id prefix matching: how much of a context a lane's KV already holds."""

from __future__ import annotations

from collections.abc import Sequence

_CHUNK = 256


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (chunks compared at C speed, then the tail)."""
    n = min(len(a), len(b))
    i = 0
    while i + _CHUNK <= n and a[i:i + _CHUNK] == b[i:i + _CHUNK]:
        i += _CHUNK
    while i < n and a[i] == b[i]:
        i += 1
    return i
