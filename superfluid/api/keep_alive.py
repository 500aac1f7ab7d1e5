"""Ollama's `keep_alive` (generate, chat, embed): how long the model stays loaded after the
request. A number is seconds, a string a Go duration ("5m", "1h30m", "0"); 0 unloads the model
once it is idle, a negative value keeps it loaded until the daemon stops, and a request
without keep_alive puts the model back on --idle-timeout (as Ollama falls back to its
default). Only an admin key or a keyless server may change it; the default model stays
loaded whatever a client asks (service/registry.py says why)."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime, timedelta

from fastapi import Request

from ..errors import BadRequest

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
MAX_SECONDS = 1e9  # ~32 years: longer is forever (and no date overflows in /api/ps)
FOREVER = "2318-01-01T00:00:00Z"  # expires_at of a model that never expires


def parse(value: object) -> float | None:
    """Seconds to stay loaded (inf: forever), or None when the request has no keep_alive."""
    if value is None:
        return None
    bad = BadRequest('keep_alive must be a number of seconds or a duration such as "5m", "1h" or "0"',
                     param="keep_alive")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise bad
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("+-")
        try:
            secs = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if not parts or "".join(a + u for a, u in parts) != text:
                raise bad from None
            secs = sum(float(a) * _UNITS[u] for a, u in parts)
        secs *= sign
    else:
        secs = float(value)
    if math.isnan(secs):
        raise bad
    return math.inf if secs < 0 or secs > MAX_SECONDS else secs


def may_change(request: Request) -> bool:
    key = request.scope.get("state", {}).get("key")
    return key is None or key.admin


def apply(request: Request, models, mid: str, seconds: float | None) -> None:
    """After the request was submitted (a model with keep_alive 0 goes once it is idle)."""
    if may_change(request):
        models.keep(mid, seconds)


def expires_at(models, mid: str) -> str:
    """Ollama's /api/ps expires_at: when the model is unloaded if nobody uses it."""
    at = models.expires(mid)
    if at is None:
        return FOREVER
    when = datetime.now(UTC) + timedelta(seconds=max(0.0, at - time.monotonic()))
    return when.isoformat().replace("+00:00", "Z")
