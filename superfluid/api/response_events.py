"""Output items and the streamed event sequence of the OpenAI Responses API: reasoning,
message and function_call items, each opened as output arrives, every event with its
`sequence_number` (and, for committed tokens, the session-log cursor as SSE id)."""

from __future__ import annotations

from collections.abc import AsyncIterator


from ..request import Calls, ToolCall
from .sse import cursor, frame, tagged


def function_call_item(rid: str, call, status: str = "completed") -> dict:
    return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
            "name": call.name, "arguments": call.arguments, "status": status}


def reasoning_item(rid: str, text: str) -> dict:
    return {"type": "reasoning", "id": "rs_" + rid[5:], "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(rid: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": "msg_" + rid[5:], "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def output_items(rid: str, text: str, reasoning: str, calls: list) -> list[dict]:
    out = []
    if reasoning:
        out.append(reasoning_item(rid, reasoning))
    if text or not calls:
        out.append(message_item(rid, text))
    out += [function_call_item(rid, c) for c in calls]
    return out


async def events(base: dict, stream, finished, session: str | None = None) -> AsyncIterator[bytes]:
    """A Responses stream from typed output chunks, live or replayed from the log."""
    rid = base["id"]
    seq = 0

    def ev(kind: str, **data) -> bytes:
        nonlocal seq
        seq += 1
        return frame({"type": kind, "sequence_number": seq - 1, **data}, kind)

    pending = {**base, "status": "in_progress", "output": [], "usage": None, "error": None,
               "incomplete_details": None}
    yield ev("response.created", response=pending)
    yield ev("response.in_progress", response=pending)
    index = -1
    open_kind: str | None = None
    text: list[str] = []
    reasoning: list[str] = []
    calls = Calls()
    args: list[str] = []  # the open call's argument fragments
    call_item: dict = {}

    def close() -> list[bytes]:
        nonlocal open_kind
        kind, open_kind = open_kind, None
        if kind == "message":
            full = "".join(text)
            part = {"type": "output_text", "text": full, "annotations": []}
            return [ev("response.output_text.done", item_id="msg_" + rid[5:], output_index=index, content_index=0,
                       text=full),
                    ev("response.content_part.done", item_id="msg_" + rid[5:], output_index=index, content_index=0,
                       part=part),
                    ev("response.output_item.done", output_index=index, item=message_item(rid, full))]
        if kind == "reasoning":
            full = "".join(reasoning)
            return [ev("response.reasoning_text.done", item_id="rs_" + rid[5:], output_index=index, content_index=0,
                       text=full),
                    ev("response.output_item.done", output_index=index, item=reasoning_item(rid, full))]
        if kind == "call":
            item = {**call_item, "arguments": "".join(args)}
            return [ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                       arguments=item["arguments"]),
                    ev("response.output_item.done", output_index=index, item=item)]
        return []

    def open_(kind: str) -> list[bytes]:
        nonlocal index, open_kind
        out = close()
        index += 1
        open_kind = kind
        if kind == "message":
            return out + [ev("response.output_item.added", output_index=index,
                             item=message_item(rid, "", "in_progress")),
                          ev("response.content_part.added", item_id="msg_" + rid[5:], output_index=index,
                             content_index=0, part={"type": "output_text", "text": "", "annotations": []})]
        if kind == "call":
            return out + [ev("response.output_item.added", output_index=index,
                             item={**call_item, "arguments": "", "status": "in_progress"})]
        return out + [ev("response.output_item.added", output_index=index,
                         item={**reasoning_item(rid, ""), "content": []})]

    async for c in stream:
        out: list[bytes] = []
        if c.reasoning:
            if open_kind != "reasoning":
                out += open_("reasoning")
            reasoning.append(c.reasoning)
            out.append(ev("response.reasoning_text.delta", item_id="rs_" + rid[5:], output_index=index,
                          content_index=0, delta=c.reasoning))
        if c.text:
            if open_kind != "message":
                out += open_("message")
            text.append(c.text)
            out.append(ev("response.output_text.delta", item_id="msg_" + rid[5:],
                          output_index=index, content_index=0, delta=c.text))
        calls.add(c.calls)
        for d in c.calls:
            if d.start:
                call_item = function_call_item(rid, ToolCall(d.id, d.name, ""))
                args.clear()
                out += open_("call")
            if d.arguments and open_kind == "call":
                args.append(d.arguments)
                out.append(ev("response.function_call_arguments.delta", item_id=call_item["id"],
                              output_index=index, delta=d.arguments))
            if d.end and open_kind == "call":
                out += close()
        if c.finish is not None:
            if c.error is not None:
                err = c.error
                failure = {"code": err.code or "server_error", "message": err.message}
                out.append(ev("response.failed", response={**pending, "status": "failed", "error": failure}))
            else:
                if index < 0:  # nothing at all: an empty message, as the non-streamed response has
                    out += open_("message")
                out += close()
                resp = await finished("".join(text), "".join(reasoning), calls.done, c)
                out.append(ev("response.completed" if resp["status"] == "completed" else "response.incomplete",
                              response=resp))
        for o in tagged(out, cursor(session, c.event_id)):
            yield o
        if c.finish is not None:
            return
