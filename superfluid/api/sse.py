"""Server-sent events framing: the one encoder every API's stream uses. A translator turns
each output chunk into a list of frames; the chunk's session-log cursor goes on the last
of them, so a client that saw it has all of that chunk and resumes after it."""

from __future__ import annotations

import orjson

DONE = b"data: [DONE]\n\n"


def event(obj: dict, id: str | None = None) -> bytes:
    """One SSE event; `id` (the session-log cursor "session:event") is what a client sends
    back as Last-Event-ID to resume."""
    data = b"data: " + orjson.dumps(obj) + b"\n\n"
    return data if id is None else b"id: " + id.encode() + b"\n" + data


def frame(obj: dict, name: str | None = None) -> bytes:
    """One SSE event with no id; `name` is its `event:` line (Anthropic and Responses)."""
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def tagged(frames: list[bytes], cur: str | None) -> list[bytes]:
    """A chunk's frames with its cursor on the last one."""
    if cur is None or not frames:
        return frames
    return frames[:-1] + [b"id: " + cur.encode() + b"\n" + frames[-1]]


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
