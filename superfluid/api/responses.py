"""The OpenAI Responses API (`/v1/responses`), text part: input as a string or message items,
`instructions`, `previous_response_id` chains, `store` (responses survive a restart),
streaming with the documented event sequence and `sequence_number`s, GET / DELETE /
input_items. Function tools and structured `text.format` are refused clearly until the
tool dialect and grammar engine land.

Stored responses live in ResponseStore, one JSON file each under <home>/responses; moving
them into the session log is a change to that class alone."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
from fastapi import FastAPI, Request

from ..errors import BadRequest, ContextLengthExceeded, SuperfluidError
from ..ids import new_id
from ..request import FinishReason, GenRequest, SamplingParams
from .schema import number_in
from ..session.turns import prelude
from .sse import cursor
from .streams import collect, raise_first_error, sse, submit_all


class ResponseNotFound(SuperfluidError):
    status = 404
    type = "invalid_request_error"
    code = "response_not_found"


class ResponseStore:
    def __init__(self, directory: Path):
        self.dir = directory

    def _path(self, rid: str) -> Path:
        if not rid.startswith("resp_") or not rid[5:].isalnum():
            raise ResponseNotFound(f"no response {rid!r}", param="response_id")
        return self.dir / f"{rid}.json"

    def put(self, record: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(record["response"]["id"])
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(record))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a crash leaves the old file or the new one

    def get(self, rid: str) -> dict:
        try:
            return orjson.loads(self._path(rid).read_bytes())
        except FileNotFoundError:
            raise ResponseNotFound(f"no response {rid!r}", param="response_id") from None

    def delete(self, rid: str) -> None:
        try:
            self._path(rid).unlink()
        except FileNotFoundError:
            raise ResponseNotFound(f"no response {rid!r}", param="response_id") from None


def _text_of(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of parts", param=where)
    out = []
    for i, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            out.append(p["text"])
        elif kind in ("input_image", "input_file"):
            raise BadRequest("this model takes text only", param=f"{where}.{i}")
        else:
            raise BadRequest(f"unsupported content part {kind!r}", param=f"{where}.{i}")
    return "".join(out)


def input_items(inp) -> list[dict]:
    """Normalize `input` to message items {type, role, content: [{type, text}]}."""
    if isinstance(inp, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": inp}]}]
    if not isinstance(inp, list) or not inp:
        raise BadRequest("input must be a string or a non-empty list of items", param="input")
    items = []
    for i, it in enumerate(inp):
        if not isinstance(it, dict) or it.get("type", "message") != "message":
            kind = it.get("type") if isinstance(it, dict) else type(it).__name__
            raise BadRequest(f"input item type {kind!r} is not supported yet", param=f"input.{i}")
        role = it.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest("role must be user, assistant, system or developer", param=f"input.{i}.role")
        text = _text_of(it.get("content", ""), f"input.{i}.content")
        part = "output_text" if role == "assistant" else "input_text"
        items.append({"type": "message", "role": role, "content": [{"type": part, "text": text}]})
    return items


def turns(items: list[dict]) -> list[dict]:
    return [{"role": "system" if it["role"] == "developer" else it["role"],
             "content": "".join(p["text"] for p in it["content"])} for it in items]


def add_routes(app: FastAPI, models, qos_for, body_of, store: ResponseStore) -> None:
    @app.post("/v1/responses")
    async def create(request: Request):
        body = await body_of(request)
        if not isinstance(body.get("model"), str):
            raise BadRequest("missing required parameter: 'model'", param="model")
        if body.get("tools"):
            raise BadRequest("tools are not supported yet", param="tools")
        fmt = ((body.get("text") or {}).get("format") or {}).get("type", "text")
        if fmt != "text":
            raise BadRequest(f"text.format {fmt!r} is not supported yet", param="text.format")
        history: list[dict] = []
        if body.get("previous_response_id"):
            prev = store.get(body["previous_response_id"])
            history = prev["conversation"] + [o for o in prev["response"]["output"] if o["type"] == "message"]
        new_items = input_items(body.get("input"))
        conversation = history + new_items
        eng = await models.get(body["model"])
        msgs = turns(conversation)
        if body.get("instructions"):
            msgs = [{"role": "system", "content": str(body["instructions"])}] + msgs
        bodies, prompt = prelude(eng, msgs)
        room = eng.n_ctx - len(prompt)
        mt = body.get("max_output_tokens")
        if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
            raise BadRequest("max_output_tokens must be a positive integer", param="max_output_tokens")
        if room < 1 or (mt or 1) > room:
            raise ContextLengthExceeded(f"the input has {len(prompt)} tokens; the context holds {eng.n_ctx}",
                                        param="input")
        sp = SamplingParams(temperature=number_in(body, "temperature", 0, 2, 1.0, allow_null=True),
                            top_p=number_in(body, "top_p", 0.001, 1, 1.0, allow_null=True), seed=eng.new_seed())
        rid = "resp_" + new_id("r").split("-", 1)[1]
        req = GenRequest(rid, prompt, sp, mt or room, (), qos_for(request))
        streams = await submit_all(eng, [req], bodies, api="responses", params={"response_id": rid})
        base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": eng.model_id,
                "instructions": body.get("instructions"), "previous_response_id": body.get("previous_response_id"),
                "max_output_tokens": mt, "temperature": sp.temperature, "top_p": sp.top_p,
                "store": body.get("store", True) is not False, "tools": [], "tool_choice": "auto",
                "parallel_tool_calls": False, "text": {"format": {"type": "text"}}, "metadata": {}}
        record = {"conversation": conversation, "input_items": new_items}

        def finished(text: str, c) -> dict:
            resp = {**base, "status": "completed" if c.finish != FinishReason.LENGTH else "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"} if c.finish == FinishReason.LENGTH else None,
                    "error": None,
                    "output": [{"type": "message", "id": "msg_" + rid[5:], "status": "completed", "role": "assistant",
                                "content": [{"type": "output_text", "text": text, "annotations": []}]}],
                    "usage": {"input_tokens": c.prompt_tokens,
                              "input_tokens_details": {"cached_tokens": c.cached_tokens},
                              "output_tokens": c.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                              "total_tokens": c.prompt_tokens + c.completion_tokens}}
            if base["store"]:
                store.put({**record, "response": resp})
            return resp

        if body.get("stream"):
            return sse(_events(base, streams[0], finished, req.session), eng, [req])
        choices = await collect(request, streams)
        raise_first_error(choices)
        return finished("".join(choices[0].text), choices[0].last)

    @app.get("/v1/responses/{rid}")
    async def retrieve(rid: str):
        return store.get(rid)["response"]

    @app.delete("/v1/responses/{rid}")
    async def delete(rid: str):
        store.delete(rid)
        return {"id": rid, "object": "response.deleted", "deleted": True}

    @app.get("/v1/responses/{rid}/input_items")
    async def items(rid: str):
        its = [{**it, "id": f"msg_{rid[5:]}_{i}", "status": "completed"}
               for i, it in enumerate(store.get(rid)["input_items"])]
        return {"object": "list", "data": its, "first_id": its[0]["id"] if its else None,
                "last_id": its[-1]["id"] if its else None, "has_more": False}


async def _events(base: dict, stream, finished, session: str | None = None) -> AsyncIterator[bytes]:
    seq = 0

    def ev(kind: str, _id: str | None = None, **data) -> bytes:
        nonlocal seq
        seq += 1
        head = b"id: " + _id.encode() + b"\n" if _id else b""
        return head + b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(
            {"type": kind, "sequence_number": seq - 1, **data}) + b"\n\n"

    item_id = "msg_" + base["id"][5:]
    pending = {**base, "status": "in_progress", "output": [], "usage": None, "error": None,
               "incomplete_details": None}
    yield ev("response.created", response=pending)
    yield ev("response.in_progress", response=pending)
    yield ev("response.output_item.added", output_index=0,
             item={"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []})
    yield ev("response.content_part.added", item_id=item_id, output_index=0, content_index=0,
             part={"type": "output_text", "text": "", "annotations": []})
    text = []
    async for c in stream:
        if c.text:
            text.append(c.text)
            yield ev("response.output_text.delta", cursor(session, c.event_id), item_id=item_id, output_index=0,
                     content_index=0, delta=c.text)
        if c.finish is None:
            continue
        if c.error is not None:
            err = c.error if isinstance(c.error, SuperfluidError) else SuperfluidError(str(c.error))
            failure = {"code": err.code or "server_error", "message": err.message}
            yield ev("response.failed", response={**pending, "status": "failed", "error": failure})
            return
        full = "".join(text)
        resp = finished(full, c)
        part = {"type": "output_text", "text": full, "annotations": []}
        yield ev("response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=full)
        yield ev("response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=part)
        yield ev("response.output_item.done", output_index=0, item=resp["output"][0])
        yield ev("response.completed" if resp["status"] == "completed" else "response.incomplete", response=resp)
        return
