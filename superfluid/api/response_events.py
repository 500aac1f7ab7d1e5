"""Output items and the streamed event sequence of the OpenAI Responses API: reasoning,
message and function_call items, each opened as output arrives, every event with its
`sequence_number` (and, for committed tokens, the session-log cursor as SSE id)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace

from ..request import Calls, ToolCall
from . import openai as oa
from .blocks import Blocks
from .sse import cursor, frame, tagged
from .streams import timings


SEP = "__"  # a namespace's function is offered to the model as NAMESPACE__NAME


def namespaces(tools: object) -> frozenset[str]:
    """The names of the `namespace` tools a request offered (its `tools`, as given)."""
    if not isinstance(tools, list):
        return frozenset()
    return frozenset(t["name"] for t in tools
                     if isinstance(t, dict) and t.get("type") == "namespace" and isinstance(t.get("name"), str))


def split_name(name: str, spaces: frozenset[str]) -> dict:
    """A called function's `name` (and `namespace`, for one offered in a namespace tool), as
    clients that send namespaces read them back (Codex dispatches on both)."""
    ns, sep, inner = name.partition(SEP)
    return {"name": inner, "namespace": ns} if sep and inner and ns in spaces else {"name": name}


def function_call_item(rid: str, call, status: str = "completed", spaces: frozenset[str] = frozenset()) -> dict:
    return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
            **split_name(call.name, spaces), "arguments": call.arguments, "status": status}


def reasoning_item(rid: str, text: str) -> dict:
    return {"type": "reasoning", "id": "rs_" + rid[5:], "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(rid: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": "msg_" + rid[5:], "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def output_items(rid: str, text: str, reasoning: str, calls: list, spaces: frozenset[str] = frozenset()) -> list[dict]:
    out = []
    if reasoning:
        out.append(reasoning_item(rid, reasoning))
    if text or not calls:
        out.append(message_item(rid, text))
    out += [function_call_item(rid, c, spaces=spaces) for c in calls]
    return out


class _Events:
    """The Responses output items (api/blocks.py): reasoning, message and function_call,
    each opened, added to and closed with its own events, every one numbered."""

    def __init__(self, rid: str, spaces: frozenset[str] = frozenset()):
        self.rid = rid
        self.spaces = spaces
        self.seq = 0
        self.parts: list[str] = []  # the open item's text or arguments so far
        self.call: dict = {}  # the open function_call item
        self.extra: dict = {}  # more fields for the deltas (llama-server's timings_per_token)

    def ev(self, kind: str, **data) -> bytes:
        self.seq += 1
        return frame({"type": kind, "sequence_number": self.seq - 1, **data}, kind)

    def open(self, index: int, kind: str, call) -> list[bytes]:
        rid = self.rid
        self.parts = []
        if kind == "text":
            return [self.ev("response.output_item.added", output_index=index,
                            item=message_item(rid, "", "in_progress")),
                    self.ev("response.content_part.added", item_id="msg_" + rid[5:], output_index=index,
                            content_index=0, part={"type": "output_text", "text": "", "annotations": []})]
        if kind == "call":
            self.call = function_call_item(rid, ToolCall(call.id, call.name, ""), spaces=self.spaces)
            return [self.ev("response.output_item.added", output_index=index,
                            item={**self.call, "status": "in_progress"})]
        return [self.ev("response.output_item.added", output_index=index,
                        item={**reasoning_item(rid, ""), "content": []})]

    def add(self, index: int, kind: str, piece: str) -> list[bytes]:
        self.parts.append(piece)
        if kind == "text":
            return [self.ev("response.output_text.delta", item_id="msg_" + self.rid[5:], output_index=index,
                            content_index=0, delta=piece, **self.extra)]
        if kind == "call":
            return [self.ev("response.function_call_arguments.delta", item_id=self.call["id"],
                            output_index=index, delta=piece)]
        return [self.ev("response.reasoning_text.delta", item_id="rs_" + self.rid[5:], output_index=index,
                        content_index=0, delta=piece)]

    def close(self, index: int, kind: str) -> list[bytes]:
        rid, full = self.rid, "".join(self.parts)
        if kind == "text":
            part = {"type": "output_text", "text": full, "annotations": []}
            return [self.ev("response.output_text.done", item_id="msg_" + rid[5:], output_index=index,
                            content_index=0, text=full),
                    self.ev("response.content_part.done", item_id="msg_" + rid[5:], output_index=index,
                            content_index=0, part=part),
                    self.ev("response.output_item.done", output_index=index, item=message_item(rid, full))]
        if kind == "call":
            item = {**self.call, "arguments": full}
            return [self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=full),
                    self.ev("response.output_item.done", output_index=index, item=item)]
        return [self.ev("response.reasoning_text.done", item_id="rs_" + rid[5:], output_index=index,
                        content_index=0, text=full),
                self.ev("response.output_item.done", output_index=index, item=reasoning_item(rid, full))]


async def events(base: dict, stream, finished, session: str | None = None,
                 with_timings: bool = False) -> AsyncIterator[bytes]:
    """A Responses stream from typed output chunks, live or replayed from the log. llama-server's
    telemetry: a progress chunk (return_progress) is a `response.in_progress` event with its
    `prompt_progress`; `with_timings` (timings_per_token) puts `timings` on the text deltas and
    the last event."""
    api = _Events(base["id"], namespaces(base.get("tools")))
    t0, first = time.monotonic(), None
    pending = {**base, "status": "in_progress", "output": [], "usage": None, "error": None,
               "incomplete_details": None}
    yield api.ev("response.created", response=pending)
    yield api.ev("response.in_progress", response=pending)
    blocks = Blocks(api)
    text: list[str] = []
    reasoning: list[str] = []
    calls = Calls()
    async for c in stream:
        if c.progress is not None:
            yield api.ev("response.in_progress", response=pending, prompt_progress=oa.prompt_progress(c.progress))
            continue
        if first is None:
            first = time.monotonic() - t0
        if with_timings:
            api.extra = {"timings": timings(replace(c, ttft_s=c.ttft_s or first), time.monotonic() - t0)}
        text.append(c.text)
        reasoning.append(c.reasoning)
        calls.add(c.calls)
        out = blocks.feed(c)
        if c.finish is not None:
            if c.error is not None:
                err = c.error
                failure = {"code": err.code or "server_error", "message": err.message}
                out.append(api.ev("response.failed", response={**pending, "status": "failed", "error": failure}))
            else:
                if blocks.index < 0:  # nothing at all: an empty message, as the non-streamed response has
                    out += blocks.text()
                out += blocks.close()
                resp = await finished("".join(text), "".join(reasoning), calls.done, c)
                out.append(api.ev("response.completed" if resp["status"] == "completed" else "response.incomplete",
                                  response=resp, **api.extra))
        for o in tagged(out, cursor(session, c.event_id)):
            yield o
        if c.finish is not None:
            return
