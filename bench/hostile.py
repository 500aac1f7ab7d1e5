"""The hostile clients of bench/soak.py (--hostile, issue 54): each kind of request the
round-four findings describe, and the client loop that sends them (soak.py's docstring says
what each kind sends and expects)."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
from hostile_core import (
    MODEL, MARK, DEPTH, DEEP_OBJ, DEEP_LIST, MAX_BODY, WAIT, INJECT, WEIRD, USER, SCHEMA, FOUR_XX, LEGAL, WRONG,
    GARBAGE, ODD, KNOBS, Hostile, deep, send, ascii_header,
)

async def hosted_types(c: httpx.AsyncClient, h: Hostile, rng: random.Random) -> None:
    """Issue 54 (high): a hosted tool whose type holds non-Latin-1 characters and newlines.
    Legal (the tool is left out): a 200, the header naming it in printable ASCII."""
    weird, stream = rng.choice(WEIRD), rng.random() < 0.5
    if rng.random() < 0.5:
        kind, path, ends = "hosted tool type: Responses", "/v1/responses", ("response.completed", "response.incomplete")
        body = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 8, "stream": stream,
                "tools": [{"type": weird}, {"type": "web_search_preview"},
                          {"type": "function", "name": "lookup", "parameters": SCHEMA}]}
    else:
        kind, path, ends = "hosted tool type: Anthropic", "/v1/messages", ("message_stop",)
        body = {"model": MODEL, "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "Say hi."}],
                "tools": [{"type": "web_search_" + weird, "name": "web_search"},
                          {"name": "lookup", "input_schema": SCHEMA}]}
    kind += " (stream)" if stream else ""
    r = await send(c, h, kind, "POST", path, {200}, body)
    if r is None or r.status_code != 200:
        return
    why = ascii_header(r, b"x-superfluid-dropped-tools")
    if why is None and stream and not any(e in r.text for e in ends):
        why = f"the stream did not end ({' or '.join(ends)})"
    if why is None and not stream and r.json().get("type" if "messages" in path else "object") not in ("message",
                                                                                                     "response"):
        why = "not a message or a response"
    if why:
        h.fail(kind, why, body, r.content)


async def markers(c: httpx.AsyncClient, h: Hostile, rng: random.Random) -> None:
    """Issue 54 (medium): chat markers in tool-call names, arguments, call ids and tool
    descriptions. Kept text (a 200) or refused (a typed 400)."""
    fields = {f for f in ("name", "arguments", "id", "description") if rng.random() < 0.5} or {"arguments"}
    name = "look" + INJECT if "name" in fields else "lookup"
    call_id = "call_" + INJECT if "id" in fields else "call_1"
    args = {"account": INJECT if "arguments" in fields else "A1"}
    desc = INJECT if "description" in fields else "Look a code up"
    api = rng.choice(["chat", "anthropic", "responses", "ollama"])
    kind = f"chat markers in tool fields: {api}"
    if api == "chat":
        path, body = "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 8, "messages": USER + [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
                {"role": "tool", "tool_call_id": call_id, "content": "balance 42"}],
            "tools": [{"type": "function", "function": {"name": name, "description": desc, "parameters": SCHEMA}}]}
    elif api == "anthropic":
        path, body = "/v1/messages", {
            "model": MODEL, "max_tokens": 8, "messages": USER + [
                {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name, "input": args}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call_id, "content": "balance 42"}]}],
            "tools": [{"name": name, "description": desc, "input_schema": SCHEMA}]}
    elif api == "responses":
        path, body = "/v1/responses", {
            "model": MODEL, "max_output_tokens": 8, "input": USER + [
                {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(args)},
                {"type": "function_call_output", "call_id": call_id, "output": "balance 42"}],
            "tools": [{"type": "function", "name": name, "description": desc, "parameters": SCHEMA}]}
    else:
        path, body = "/api/chat", {
            "model": MODEL, "stream": False, "options": {"num_predict": 8}, "messages": USER + [
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": args}}]},
                {"role": "tool", "content": "balance 42"}],
            "tools": [{"type": "function", "function": {"name": name, "description": desc, "parameters": SCHEMA}}]}
    await send(c, h, kind, "POST", path, {200, 400}, body)


async def deep_bodies(c: httpx.AsyncClient, h: Hostile, rng: random.Random) -> None:
    """Issue 54 (low): JSON 300 levels deep where the daemon looks into it: typed 400s."""
    where = rng.choice(["chat arguments (text)", "chat arguments (object)", "anthropic tool_use input",
                        "responses arguments", "ollama arguments", "/completion prompt", "tool schema",
                        "session tools"])
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "@DEEP@"}}
    chat = {"model": MODEL, "max_tokens": 4, "messages": USER + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]}
    path = "/v1/chat/completions"
    if where == "chat arguments (text)":
        raw = json.dumps(chat).replace('"@DEEP@"', json.dumps(DEEP_OBJ)).encode()
    elif where == "chat arguments (object)":
        raw = deep(chat, DEEP_OBJ)
    elif where == "anthropic tool_use input":
        path, raw = "/v1/messages", deep({"model": MODEL, "max_tokens": 4, "messages": USER + [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": "@DEEP@"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}, DEEP_OBJ)
    elif where == "responses arguments":
        path, raw = "/v1/responses", json.dumps({"model": MODEL, "max_output_tokens": 4, "input": USER + [
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": DEEP_OBJ},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}).encode()
    elif where == "ollama arguments":
        call = {"function": {"name": "lookup", "arguments": "@DEEP@"}}
        path, raw = "/api/chat", deep({"model": MODEL, "stream": False, "options": {"num_predict": 4},
                                       "messages": USER + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                                           {"role": "tool", "content": "ok"}]}, DEEP_OBJ)
    elif where == "/completion prompt":
        path, raw = "/completion", deep({"prompt": "@DEEP@", "n_predict": 4},
                                        rng.choice([DEEP_LIST, '{"a":' * DEPTH + '"hi"' + "}" * DEPTH]))
    elif where == "tool schema":
        raw = deep({"model": MODEL, "max_tokens": 4, "messages": USER, "tools": [
            {"type": "function", "function": {"name": "lookup", "parameters": "@DEEP@"}}]},
            '{"type":"object","properties":{"a":' * DEPTH + "{}" + "}}" * DEPTH)
    else:
        path, raw = "/v1/sessions", deep({"model": MODEL, "tools": [
            {"type": "function", "function": {"name": "lookup", "parameters": "@DEEP@"}}]}, DEEP_OBJ)
    await send(c, h, f"deep JSON ({DEPTH} levels): {where}", "POST", path, {400}, raw=raw)


async def oversize(port: int, h: Hostile, rng: random.Random) -> None:
    """A body over --max-body, announced (Content-Length) or not (chunked): a 413, read while
    the body is still being sent (the server answers and closes before reading it all)."""
    chunked = rng.random() < 0.5
    kind = f"oversize body ({'chunked' if chunked else 'Content-Length'})"
    path = rng.choice(["/v1/chat/completions", "/v1/messages", "/api/chat", "/completion", "/v1/responses",
                       "/tokenize", f"/{MARK}big"])
    size = MAX_BODY + 1 + rng.randint(0, 1 << 20)
    head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
    head += "transfer-encoding: chunked\r\n\r\n" if chunked else f"content-length: {size}\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def write() -> None:
        piece, left = b'{"prompt": "' + b"a" * (256 * 1024 - 12), size
        try:
            while left > 0:
                part = piece[:left]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                await writer.drain()
                left -= len(part)
            if chunked:
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the server answered and closed: the answer is read below

    t0 = time.perf_counter()
    writer.write(head.encode())
    sender = asyncio.create_task(write())
    try:
        line = await asyncio.wait_for(reader.readline(), WAIT)
        headers: dict[str, str] = {}
        while (hl := await asyncio.wait_for(reader.readline(), WAIT)).strip():
            k, _, v = hl.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        content = await asyncio.wait_for(reader.readexactly(n), WAIT) if n else b""
    except TimeoutError:
        h.note(kind, "timeout", time.perf_counter() - t0)
        h.fail(kind, f"no answer to POST {path} ({size} bytes) in {WAIT:.0f} s", head)
        return
    except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
        h.note(kind, "reset", time.perf_counter() - t0)
        h.fail(kind, f"POST {path} ({size} bytes): the connection was reset before a whole answer: {e!r}", head)
        return
    finally:
        sender.cancel()
        writer.close()
    parts = line.decode("latin-1").split()
    if len(parts) < 2 or not parts[1].isdigit():
        h.note(kind, "no answer", time.perf_counter() - t0)
        h.fail(kind, f"POST {path} ({size} bytes): closed without an answer", head, line)
        return
    expect = {413, 404} if MARK in path else {413}  # an unknown path may be refused before its body
    h.judge(kind, f"POST {path} ({size} bytes)", int(parts[1]), content, expect, head, time.perf_counter() - t0)


async def made_up_paths(c: httpx.AsyncClient, h: Hostile, rng: random.Random) -> None:
    """Trailing slashes and unknown paths (issue 54: each became a /metrics series): 307 or 404."""
    tok = f"{MARK}{rng.getrandbits(40):010x}"
    method, path, expect = rng.choice([
        ("GET", f"/{tok}", {404}),
        ("POST", f"/v1/{tok}", {404, 405}),
        ("GET", f"/v1/models/{tok}/", {307, 404}),
        ("GET", f"/v1/sessions/{tok}/", {307, 404}),
        ("GET", f"/v1/sessions/{tok}/events/", {307, 404}),
        ("GET", f"/v1/responses/{tok}/", {307, 404}),
        ("POST", f"/v1/chat/completions/{tok}", {404, 405}),
        ("DELETE", f"/api/{tok}/", {307, 404, 405}),
        ("GET", f"/{tok}/" + "x" * rng.randint(100, 6000), {404, 414, 431}),
        ("GET", f"/{tok}%0a%1b[31m%00/", {307, 404}),
        ("PUT", f"/{tok}/../../etc/passwd", {404, 405}),
        ("OPTIONS", f"/{tok}/", {200, 204, 307, 404, 405}),
        ("POST", "/v1/chat/completions/", {307}),
        ("GET", "/v1/models/", {307, 404}),
        ("GET", "/health/", {307, 404}),
    ])
    if MARK in path:
        h.paths.add(path)
    await send(c, h, "made-up path" if MARK in path else "trailing slash", method, path, frozenset(expect))


async def bad_headers(c: httpx.AsyncClient, h: Hostile, rng: random.Random, port: int) -> None:
    """A foreign Host on this loopback server (DNS rebinding) and repeated headers: typed 4xx."""
    if rng.random() < 0.5:
        host = rng.choice(["evil.example", "127.0.0.1.nip.io", f"localhost.attacker.test:{port}", "10.0.0.1",
                           "[::2]", "localhost@evil.example", "", "x" * 300])
        method, path = rng.choice([("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/chat/completions"),
                                   ("GET", "/"), ("GET", "/v1/sessions")])
        body = LEGAL["/v1/chat/completions"] if method == "POST" else None
        await send(c, h, "foreign Host header", method, path, {400, 403, 421}, body, headers={"host": host})
    else:
        name, values = rng.choice([("x-superfluid-qos", ["interactive", "background"]),
                                   ("content-type", ["application/json", "text/plain"]),
                                   ("last-event-id", ["1", "2"]), ("host", [f"127.0.0.1:{port}", "evil.example"]),
                                   ("host", [f"127.0.0.1:{port}", f"127.0.0.1:{port}"]),
                                   ("authorization", ["Bearer a", "Bearer b"]), ("origin", ["null", "null"])])
        if name != "host":
            await send(c, h, "repeated header", "POST", "/v1/chat/completions", {400, 403},
                       LEGAL["/v1/chat/completions"], headers=[(name, v) for v in values])
            return
        data = json.dumps(LEGAL["/v1/chat/completions"]).encode()  # httpx will not send two Hosts
        head = "".join(f"host: {v}\r\n" for v in values)
        await on_the_wire(h, "repeated header", port, f"POST /v1/chat/completions HTTP/1.1\r\n{head}content-type: "
                          f"application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data, {400, 403})


async def on_the_wire(h: Hostile, kind: str, port: int, request: bytes, expect: set) -> None:
    """A request httpx would not send, written as bytes; its answer judged."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), WAIT)
        n = 0
        while (hl := await asyncio.wait_for(reader.readline(), WAIT)).strip():
            k, _, v = hl.decode("latin-1").partition(":")
            n = int(v) if k.strip().lower() == "content-length" else n
        content = await asyncio.wait_for(reader.readexactly(n), WAIT)
    except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError, ValueError) as e:
        h.note(kind, "no answer", time.perf_counter() - t0)
        h.fail(kind, f"no whole answer: {e!r}", request)
        return
    finally:
        writer.close()
    parts = line.decode("latin-1").split()
    if len(parts) < 2 or not parts[1].isdigit():
        h.note(kind, "no answer", time.perf_counter() - t0)
        h.fail(kind, "closed without an answer", request, line)
        return
    h.judge(kind, request.split(b"\r\n", 1)[0].decode(), int(parts[1]), content, expect, request,
            time.perf_counter() - t0)


async def garbage(c: httpx.AsyncClient, h: Hostile, rng: random.Random) -> None:
    """Garbage bodies and wrong types on each API: typed 400s (422 allowed)."""
    path = rng.choice(list(LEGAL))
    if rng.random() < 0.5:
        raw = rng.choice(GARBAGE)
        await send(c, h, "garbage body", "POST", path, {400, 413, 415, 422}, raw=raw)
    else:
        body = {**LEGAL[path], **rng.choice(WRONG[path])}
        await send(c, h, f"wrong type: {path}", "POST", path, {400, 404, 422}, body)


async def mutated(c: httpx.AsyncClient, h: Hostile, rng: random.Random) -> None:
    """A legal body with one field set to an odd value: whatever it is, a 200 or a typed 4xx."""
    path = rng.choice(list(LEGAL))
    body = json.loads(json.dumps(LEGAL[path]))
    key = rng.choice(list(body) + KNOBS)
    body[key] = rng.choice(ODD)
    await send(c, h, "mutated legal body", "POST", path, FOUR_XX | {200}, body, timeout=3 * WAIT)


async def hang_up(c: httpx.AsyncClient, h: Hostile, rng: random.Random, port: int) -> None:
    """A streamed request whose client goes at once: the generation (900 tokens asked) is cut.
    On the wire before any answer, or after the answer's head (then its session must be idle
    within 10 s); the end of the run checks that nothing is left running."""
    path, body = rng.choice([
        ("/v1/chat/completions", {"model": MODEL, "stream": True, "max_tokens": 900, "messages": [
            {"role": "user", "content": f"Write a long story about the number {rng.randint(0, 9999)}."}]}),
        ("/v1/messages", {"model": MODEL, "stream": True, "max_tokens": 900, "messages": [
            {"role": "user", "content": f"Write a long story about the number {rng.randint(0, 9999)}."}]}),
        ("/v1/responses", {"model": MODEL, "stream": True, "max_output_tokens": 900,
                           "input": f"Write a long story about the number {rng.randint(0, 9999)}."}),
        ("/api/chat", {"model": MODEL, "options": {"num_predict": 900}, "messages": [
            {"role": "user", "content": f"Write a long story about the number {rng.randint(0, 9999)}."}]}),
    ])
    data = json.dumps(body).encode()
    if rng.random() < 0.5:
        kind = "stream hung up at once (on the wire)"
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
                     f"content-length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()
        writer.close()
        h.note(kind, "hung up")
        return
    kind = "stream hung up after its head"
    t0 = time.perf_counter()
    try:
        async with c.stream("POST", path, content=data, headers={"content-type": "application/json"},
                            timeout=WAIT) as r:
            status, sid = r.status_code, r.headers.get("x-superfluid-session")
            if status != 200:
                await r.aread()
                h.judge(kind, f"POST {path}", status, r.content, {200}, data, time.perf_counter() - t0)
                return
    except httpx.TimeoutException:
        h.note(kind, "timeout", time.perf_counter() - t0)
        h.fail(kind, f"no answer's head for POST {path} in {WAIT:.0f} s", data)
        return
    h.note(kind, status, time.perf_counter() - t0)
    if not sid:
        return
    for _ in range(100):
        r = await c.get(f"/v1/sessions/{sid}", timeout=WAIT)
        if r.status_code != 200 or not r.json().get("busy"):
            break
        await asyncio.sleep(0.1)
    else:
        h.fail(kind, f"session {sid} still generating 10 s after its client hung up", data, r.content)


async def hostile_client(url: str, port: int, h: Hostile, seed: int, until: float) -> None:
    rng = random.Random(1_000_003 * (seed + 1))
    kinds = [(hosted_types, 3), (markers, 3), (mutated, 3), (hang_up, 2),  # these generate: seconds each
             (deep_bodies, 6), (made_up_paths, 6), (bad_headers, 4), (garbage, 8), (oversize, 0.5)]
    async with httpx.AsyncClient(base_url=url, timeout=WAIT) as c:
        while time.monotonic() < until:
            fn = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            try:
                if fn is oversize:
                    await oversize(port, h, rng)
                elif fn in (bad_headers, hang_up):
                    await fn(c, h, rng, port)
                else:
                    await fn(c, h, rng)
            except Exception as e:  # noqa: BLE001 (the soak's own fault: listed, not fatal)
                h.note(fn.__name__, "client error")
                h.fail(fn.__name__, f"the hostile client itself failed: {type(e).__name__}: {e}")
            await asyncio.sleep(rng.uniform(0, 0.05))
