"""Stored Responses (`store: true`): a record {conversation, input_items, response} per id,
kept in the session store's `responses` table, so a stored response survives a restart and
`previous_response_id` can chain from it. A key sees only its own (an admin sees all)."""

from __future__ import annotations

import orjson

from ..errors import SuperfluidError
from .policy import may_see


class ResponseNotFound(SuperfluidError):
    status = 404
    type = "invalid_request_error"
    code = "response_not_found"


class ResponseStore:
    """Stored responses: a record {conversation, input_items, response} per id, in the
    session store's `responses` table."""

    def __init__(self, store):
        self.store = store

    @staticmethod
    def _check(rid: str) -> None:
        if not rid.startswith("resp_") or not rid[5:].isalnum():
            raise ResponseNotFound(f"no response {rid!r}", param="response_id")

    async def put(self, record: dict, session: str | None) -> None:
        await self.store.put_response(record["response"]["id"], session, orjson.dumps(record))

    async def visible(self, rid: str, request) -> None:
        """Keys own their stored responses: another key's is not found (an admin sees all)."""
        self._check(rid)
        exists, owner = await self.store.response_owner(rid)
        if not exists or not may_see(request, owner):
            raise ResponseNotFound(f"no response {rid!r}", param="response_id")

    async def get(self, rid: str) -> dict:
        self._check(rid)
        raw = await self.store.response(rid)
        if raw is None:
            raise ResponseNotFound(f"no response {rid!r}", param="response_id")
        return orjson.loads(raw)

    async def delete(self, rid: str) -> None:
        self._check(rid)
        if not await self.store.delete_response(rid):
            raise ResponseNotFound(f"no response {rid!r}", param="response_id")
