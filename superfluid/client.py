"""A small Python client for superfluid's native session API (httpx only).

    from superfluid.client import Client
    c = Client("http://127.0.0.1:8453")
    s = c.create(system="Be brief.", temperature=0)
    c.append(s["id"], "user", "Name three colors.")
    for ev in c.stream(s["id"], max_tokens=32):
        print(ev["text"], end="", flush=True)

Streams yield the session's events as dicts; each carries its cursor (`session`, `id`), so
a stream that breaks can be picked up with `resume(session, after=id)`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx

_List = list  # the builtin, for annotations inside Client (which has a list method)


class APIError(Exception):
    def __init__(self, status: int, body: dict):
        err = body.get("error", body) if isinstance(body, dict) else {}
        self.status = status
        self.type = err.get("type")
        self.code = err.get("code")
        self.message = err.get("message") or str(body)
        super().__init__(f"{status} {self.code or self.type}: {self.message}")


def iter_sse(lines: Iterator[str]) -> Iterator[tuple[str | None, dict | str]]:
    """(id, data) per server-sent event; data is parsed JSON, or the raw string ([DONE])."""
    eid: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                raw = "\n".join(data)
                try:
                    yield eid, json.loads(raw)
                except ValueError:
                    yield eid, raw
            eid, data = None, []
        elif line.startswith("id:"):
            eid = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


class Client:
    def __init__(self, base_url: str = "http://127.0.0.1:8453", *, api_key: str | None = None,
                 timeout: float = 300.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw) -> dict:
        r = self.http.request(method, path, **kw)
        body = r.json() if r.content else {}
        if r.status_code >= 400:
            raise APIError(r.status_code, body)
        return body

    def _stream(self, method: str, path: str, **kw) -> Iterator[tuple[str | None, dict | str]]:
        with self.http.stream(method, path, **kw) as r:
            if r.status_code >= 400:
                r.read()
                raise APIError(r.status_code, r.json())
            for eid, data in iter_sse(r.iter_lines()):
                if data == "[DONE]":
                    return
                yield eid, data

    # -- sessions ----------------------------------------------------------------------
    def create(self, *, model: str | None = None, system: str | None = None, title: str | None = None,
               tools: _List[dict] | None = None, raw: bool = False, **sampling) -> dict:
        body = {"model": model, "system": system, "title": title, "tools": tools, "raw": raw, **sampling}
        return self._call("POST", "/v1/sessions", json={k: v for k, v in body.items() if v is not None})

    def get(self, session: str) -> dict:
        return self._call("GET", f"/v1/sessions/{session}")

    def list(self, *, limit: int = 100, archived: bool | None = None) -> _List[dict]:
        params: dict = {"limit": limit}
        if archived is not None:
            params["archived"] = "true" if archived else "false"
        return self._call("GET", "/v1/sessions", params=params)["data"]

    def update(self, session: str, *, title: str | None = None, archived: bool | None = None) -> dict:
        body = {k: v for k, v in (("title", title), ("archived", archived)) if v is not None}
        return self._call("PATCH", f"/v1/sessions/{session}", json=body)

    def purge(self, session: str) -> dict:
        return self._call("DELETE", f"/v1/sessions/{session}")

    def append(self, session: str, role: str, content: str) -> _List[dict]:
        return self._call("POST", f"/v1/sessions/{session}/messages",
                          json={"role": role, "content": content})["data"]

    def tool_result(self, session: str, call_id: str, content: str) -> _List[dict]:
        return self._call("POST", f"/v1/sessions/{session}/tool_results",
                          json={"call_id": call_id, "content": content})["data"]

    def generate(self, session: str, *, max_tokens: int | None = None, **sampling) -> dict:
        body = {"max_tokens": max_tokens, "stream": False, **sampling}
        return self._call("POST", f"/v1/sessions/{session}/generate",
                          json={k: v for k, v in body.items() if v is not None})

    def stream(self, session: str, *, max_tokens: int | None = None, **sampling) -> Iterator[dict]:
        """Generated events as they commit; the last one has `finish` set."""
        body = {"max_tokens": max_tokens, "stream": True, **sampling}
        for _, data in self._stream("POST", f"/v1/sessions/{session}/generate",
                                    json={k: v for k, v in body.items() if v is not None}):
            if isinstance(data, dict) and data.get("type") == "error":
                raise APIError(500, data)
            yield data  # type: ignore[misc]

    def cancel(self, session: str) -> bool:
        return self._call("POST", f"/v1/sessions/{session}/cancel")["cancelled"]

    def events(self, session: str, *, after: int = -1, limit: int | None = None) -> _List[dict]:
        params: dict = {"after": after}
        if limit is not None:
            params["limit"] = limit
        return self._call("GET", f"/v1/sessions/{session}/events", params=params)["data"]

    def fork(self, session: str, at: int | None = None) -> dict:
        return self._call("POST", f"/v1/sessions/{session}/fork", json={} if at is None else {"at": at})

    def trim(self, session: str, to: int) -> dict:
        return self._call("POST", f"/v1/sessions/{session}/trim", json={"to": to})

    def subscribe(self, session: str, *, after: int = -1) -> Iterator[dict]:
        """Every event after `after`, then live ones, until the caller stops reading."""
        for _, data in self._stream("GET", f"/v1/sessions/{session}/subscribe", params={"after": after}):
            yield data  # type: ignore[misc]

    def resume(self, session: str, *, after: int, continue_cut: bool = True) -> Iterator[tuple[str | None, dict]]:
        """The rest of a generation after event `after` (Last-Event-ID), in the format of
        the API that started it: (cursor, event) pairs. A request's generation that a
        restart cut off is continued to its budget unless continue_cut is False."""
        yield from self._stream("GET", f"/v1/sessions/{session}/resume",  # type: ignore[misc]
                                headers={"Last-Event-ID": f"{session}:{after}"},
                                params={} if continue_cut else {"continue": "false"})
