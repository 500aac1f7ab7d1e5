"""Background responses of the OpenAI Responses API (`background: true`): the request returns
at once (status "queued"), a task owned by the daemon, not by a connection, reads the
generation to its end and stores the finished response; `GET /v1/responses/{id}` polls it,
`POST /v1/responses/{id}/cancel` cancels it, and `GET /v1/responses/{id}?stream=true&
starting_after=N` streams it from the session log (api/resume.py), dropping the events
numbered N and before, then goes on live: the same events the original stream had.

A background response that was running when the daemon stopped reads, after the restart,
as "failed" (code generation_interrupted) with the output the log holds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson

from ..errors import BadRequest
from ..request import CallDelta, Calls, Chunk
from ..session.events import Generated
from .openai import Choice
from .resume import INTERRUPTED, rest_of_generation
from .response_events import output_items

log = logging.getLogger("superfluid.api")

UNFINISHED = ("queued", "in_progress")
Finish = Callable[[str, str, list, Chunk], Awaitable[dict]]


class Background:
    """The background responses this daemon runs now, by response id."""

    def __init__(self, sessions, store):
        self.sessions = sessions
        self.store = store  # api/responses.py ResponseStore
        self.tasks: dict[str, asyncio.Task] = {}

    async def start(self, record: dict, stream: AsyncIterator[Chunk], finished: Finish,
                    release: Callable[[], None] | None = None) -> dict:
        """Store the response as queued and read its generation in a task of its own;
        `finished` stores the final response; `release` is called once it has ended (the key's
        concurrency slot). Returns the queued response."""
        rid = record["response"]["id"]
        try:
            resp = {**record["response"], "status": "queued"}
            await self.store.put({**record, "response": resp}, record["session"])
            task = asyncio.get_running_loop().create_task(self._run(record, stream, finished))
        except BaseException:
            if release is not None:
                release()
            raise
        self.tasks[rid] = task

        def ended(_t) -> None:
            self.tasks.pop(rid, None)
            if release is not None:
                release()
        task.add_done_callback(ended)
        return resp

    async def _run(self, record: dict, stream: AsyncIterator[Chunk], finished: Finish) -> None:
        sid = record["session"]
        # this task watches the generation, so no stream of it closing cuts it (resume.py)
        gen = self.sessions.watch(sid)
        try:
            ch = Choice()
            started = False
            async for c in stream:
                if not started and c.finish is None:
                    started = True
                    await self.store.put({**record, "response": {**record["response"], "status": "in_progress"}},
                                         sid)
                ch.add(c)
                if c.finish is not None:
                    break
            if ch.last is None:
                return
            if ch.error is not None:
                err = ch.error
                failure = {"code": getattr(err, "code", None) or "server_error", "message": str(err)}
                await self.store.put({**record, "response": {**record["response"], "status": "failed",
                                                             "error": failure}}, sid)
                return
            await finished("".join(ch.text), "".join(ch.reasoning), ch.tool_calls, ch.last)
        except asyncio.CancelledError:  # the daemon is stopping: the log keeps what was generated
            raise
        except Exception:
            log.exception("background response %s failed", record["response"]["id"])
        finally:
            self.sessions.unwatch(gen)

    async def current(self, rid: str) -> dict:
        """The stored record, with an unfinished response that no task of this daemon runs
        (the daemon stopped while it ran) settled as failed, with the output the log holds."""
        rec = await self.store.get(rid)
        resp = rec["response"]
        if resp.get("status") not in UNFINISHED or rid in self.tasks:
            return rec
        text, reasoning, calls = await self._logged(rec.get("session"))
        resp = {**resp, "status": "failed", "output": output_items(rid, text, reasoning, calls),
                "error": {"code": "generation_interrupted", "message": INTERRUPTED}}
        rec = {**rec, "response": resp}
        await self.store.put(rec, rec.get("session"))
        return rec

    async def _logged(self, sid: str | None) -> tuple[str, str, list]:
        if not sid:
            return "", "", []
        text, reasoning, calls = [], [], Calls()
        for ev in await self.sessions.store.events(sid):
            b = ev.body
            if isinstance(b, Generated):
                text.append(b.text)
                reasoning.append(b.reasoning)
                calls.add([CallDelta.from_wire(d) for d in b.calls])
        return "".join(text), "".join(reasoning), calls.done

    async def cancel(self, rid: str) -> dict:
        """Cancel a background response that runs; cancelling one again returns it."""
        rec = await self.store.get(rid)
        if not rec["response"].get("background"):
            raise BadRequest("only a background response can be cancelled", param="response_id")
        task = self.tasks.get(rid)
        if task is not None:
            self.sessions.cancel(rec["session"])
            await asyncio.shield(task)  # it stores the cancelled response
            return (await self.store.get(rid))["response"]
        resp = (await self.current(rid))["response"]
        if resp["status"] != "cancelled":
            raise BadRequest(f"response {rid} is {resp['status']}; only a queued or in-progress one can be "
                             "cancelled", param="response_id")
        return resp

    async def stream(self, rid: str, starting_after: int) -> AsyncIterator[bytes]:
        """The response's event stream from the log, after sequence number `starting_after`."""
        rec = await self.store.get(rid)
        sid = rec.get("session")
        if not sid:
            raise BadRequest(f"response {rid} has no stream to read", param="stream")
        await self.sessions.state(sid)  # SessionNotFound (404) for one whose log was purged
        return after_sequence(rest_of_generation(self.sessions, sid, -1, None), starting_after)


async def after_sequence(frames: AsyncIterator[bytes], n: int) -> AsyncIterator[bytes]:
    """The Responses SSE frames numbered after n (comment lines pass)."""
    async for b in frames:
        if n < 0 or b.startswith(b":"):
            yield b
            continue
        at = b.find(b"data: ")
        seq = orjson.loads(b[at + 6:]).get("sequence_number") if at >= 0 else None
        if not isinstance(seq, int) or seq > n:
            yield b


def starting_after(raw: str | None) -> int:
    if raw is None:
        return -1
    try:
        n = int(raw)
    except ValueError:
        raise BadRequest("starting_after must be an integer", param="starting_after") from None
    if n < 0:
        raise BadRequest("starting_after must be at least 0", param="starting_after")
    return n
