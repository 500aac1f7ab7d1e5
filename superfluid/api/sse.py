"""Server-sent events framing."""

from __future__ import annotations

import orjson

DONE = b"data: [DONE]\n\n"


def event(obj: dict, id: str | None = None) -> bytes:
    """One SSE event; `id` (the session-log cursor "session:event") is what a client sends
    back as Last-Event-ID to resume."""
    data = b"data: " + orjson.dumps(obj) + b"\n\n"
    return data if id is None else b"id: " + id.encode() + b"\n" + data


def cursor(session: str | None, event_id: int | None) -> str | None:
    return None if session is None or event_id is None else f"{session}:{event_id}"


def parse_cursor(raw: str | None) -> tuple[str, int] | None:
    """'session:event' -> (session, event); None for a missing or malformed cursor."""
    if not raw or ":" not in raw:
        return None
    sid, _, eid = raw.strip().rpartition(":")
    try:
        return sid, int(eid)
    except ValueError:
        return None
