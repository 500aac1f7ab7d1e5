"""Server-sent events framing: the one encoder every API's stream uses. A translator turns
each output chunk into a list of frames, and every frame carries a cursor: the chunk's
session-log cursor ("session:event") on the last of them, so a client that saw it has all
of that chunk and resumes after it, and "session:event.k" on frame k before it, so a client
cut between two frames of one chunk (an SSE client keeps the last id it saw) resumes with
the next frame, never seeing one twice."""

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
    """A chunk's frames, each with its cursor: the chunk's on the last, the frame's before."""
    if cur is None or not frames:
        return frames
    last = len(frames) - 1
    return [b"id: " + (cur if k == last else f"{cur}.{k}").encode() + b"\n" + f for k, f in enumerate(frames)]


def cursor(session: str | None, event_id: int | None) -> str | None:
    return None if session is None or event_id is None else f"{session}:{event_id}"


def parse_cursor(raw: str | None) -> tuple[str, int, int | None] | None:
    """'session:event' -> (session, event, None), 'session:event.k' (frame k of the event's
    chunk seen, not the rest) -> (session, event, k); None for a missing or malformed one."""
    if not raw or ":" not in raw:
        return None
    sid, _, eid = raw.strip().rpartition(":")
    event, dot, frame = eid.partition(".")
    try:
        return sid, int(event), (int(frame) if dot else None)
    except ValueError:
        return None
