"""The daemon's HTTP connections: uvicorn's httptools protocol with the two bounds it lacks.

- **A header deadline.** uvicorn waits forever for a request's headers: a client that opens
  connections and sends a byte now and then (slowloris) holds each one. Here the headers of
  every request, the first on a connection and each one after, must arrive within
  `header_timeout` seconds, or the connection is closed (nginx's client_header_timeout).
  Reading the body and streaming the answer are not bounded by it.
- **A connection cap.** Past `max_connections` open connections a new one gets a 503 and is
  closed at once, before it can cost the others a file descriptor for long.

`protocol(max_connections, header_timeout)` is the class to hand uvicorn (`Config(http=…)`)."""

from __future__ import annotations

import asyncio
import json
import resource

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FULL = json.dumps({"error": {"message": "the server has too many open connections; retry shortly",
                             "type": "server_error", "code": "too_many_connections"}}).encode()
FULL_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(FULL), FULL))


class GuardedHttp(HttpToolsProtocol):
    max_connections = 1024
    header_timeout = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            transport.write(FULL_RESPONSE)
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._arm()  # the next request's headers, on this kept-alive connection

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout, self._late)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()  # type: ignore[union-attr]
            self._deadline = None

    def _late(self) -> None:
        """The headers did not arrive in time: close, unless a request is running (its
        headers came; a pipelined one is answered in turn)."""
        self._deadline = None
        running = self.cycle is not None and not self.cycle.response_complete
        if not running and not self.transport.is_closing():
            self.transport.close()


def protocol(max_connections: int, header_timeout: float) -> type[GuardedHttp]:
    return type("GuardedHttp", (GuardedHttp,), {"max_connections": max_connections,
                                                "header_timeout": header_timeout})


def open_files_room(wanted: int) -> int:
    """Raise this process's open-file limit toward its hard limit so that `wanted` connections
    fit beside the model, store and KV files; the connections that fit (a reserve of 256
    descriptors kept for those files)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else max(16, min(wanted, soft - 256))
