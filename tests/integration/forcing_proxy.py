"""An HTTP proxy on loopback between a real agent and the real daemon, for the deterministic
tool loop of tests/integration/test_agents.py: the agent's first generation request is
rewritten so the model must call one named tool with fixed arguments (tool_choice names the
tool, and its schema is replaced by one whose only value is those arguments); the grammar
engine then makes the real model write exactly that call. Everything else (the model's call,
the agent running the tool, the result going back, the answer) is the real path. Every
request body is kept in `bodies`, to look into.

The tool's schema is rewritten in every request, so all of them render the same tools (one
cached prefix); `choose=False` never forces a call (a one-shot that warms that prefix).
`answer`: a JSON schema the text answer must follow, in each Responses request (Codex fails a
run whose answer was cut by the output cap, which a small greedy model can ramble into) and in
each Messages or chat request carrying the tool after the forced one (a greedy model may call
the tool again and again, and Claude Code and Hermes keep going while the model calls tools:
Hermes made 5 calls and gave up in one CI run)."""

from __future__ import annotations

import http.server
import json
import sys
import threading

import httpx

from .daemon import free_port

HOP = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


def const_schema(args: dict) -> dict:
    return {"type": "object", "properties": {k: {"const": v} for k, v in args.items()},
            "required": list(args), "additionalProperties": False}


def force(path: str, body: dict, tool: str, args: dict, choose: bool = True) -> dict:
    """`body` (a generation request on `path`) with `tool` taking only `args`; forced to call
    it when `choose`."""
    out = dict(body)
    tools = [dict(t) for t in body.get("tools") or []]
    if path.startswith("/v1/messages"):
        for t in tools:
            if t.get("name") == tool:
                t["input_schema"] = const_schema(args)
        if choose:
            out["tool_choice"] = {"type": "tool", "name": tool, "disable_parallel_tool_use": True}
    elif path.startswith("/v1/responses"):
        for t in tools:
            if t.get("name") == tool:
                t["parameters"] = const_schema(args)
        if choose:
            out["tool_choice"] = {"type": "function", "name": tool}
            out["parallel_tool_calls"] = False
    else:
        for t in tools:
            if (t.get("function") or {}).get("name") == tool:
                t["function"] = {**t["function"], "parameters": const_schema(args)}
        if choose:
            out["tool_choice"] = {"type": "function", "function": {"name": tool}}
            out["parallel_tool_calls"] = False
    out["tools"] = tools
    return out


def names(body: dict) -> set:
    return {t.get("name") or (t.get("function") or {}).get("name")
            for t in body.get("tools") or [] if isinstance(t, dict)}


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """An agent that hangs up mid-stream (it had what it needed) is not an error here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ForcingProxy:
    def __init__(self, target: str, tool: str | None = None, args: dict | None = None,
                 choose: bool = True, answer: dict | None = None):
        self.target, self.tool, self.args, self.choose, self.answer = target, tool, args or {}, choose, answer
        self.bodies: list[tuple[str, dict]] = []
        self.forced = False
        self.forced_at = -1  # the forced request's index in `bodies`
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def do_HEAD(self) -> None:
                self._forward(b"")

            def do_GET(self) -> None:
                self._forward(b"")

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                if isinstance(body, dict):
                    proxy.bodies.append((self.path, body))
                    raw = json.dumps(proxy.rewrite(self.path, body)).encode()
                self._forward(raw)

            def _forward(self, raw: bytes) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                with httpx.Client(timeout=1200) as c, c.stream(self.command, proxy.target + self.path,
                                                               content=raw or None, headers=headers) as r:
                    self.send_response(r.status_code)
                    for k, v in r.headers.items():
                        if k.lower() not in HOP:
                            self.send_header(k, v)
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    if self.command == "HEAD":
                        return
                    for chunk in r.iter_raw():
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")

        self.server = _Server(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def rewrite(self, path: str, body: dict) -> dict:
        choose = False
        if self.tool in names(body):
            choose = self.choose and not self.forced
            if choose:
                self.forced, self.forced_at = True, len(self.bodies) - 1
            body = force(path, body, self.tool, self.args, choose)
        if self.answer is None or choose:
            return body
        if path.startswith("/v1/responses"):
            body = {**body, "text": {**(body.get("text") or {}), "format": {
                "type": "json_schema", "name": "answer", "schema": self.answer, "strict": True}}}
        elif path.startswith("/v1/messages") and self.tool in names(body):  # the agent's own turns
            body = {**body, "output_config": {**(body.get("output_config") or {}), "format": {
                "type": "json_schema", "schema": self.answer}}}
        elif path.startswith("/v1/chat/completions") and self.tool in names(body):
            body = {**body, "response_format": {"type": "json_schema", "json_schema": {
                "name": "answer", "schema": self.answer, "strict": True}}}
        return body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
