"""The prefix cache is no oracle across keys (issue 33): in one process (tests/harness.py),
with the real scheduler's KV slots. Key B sending key A's exact prompt reuses none of it
(`cached_tokens` 0), while each key's own shared system prompt is still prefilled once; a
`cache_salt` (vLLM's field) makes a namespace of its own; an admin key and a server without
keys share one; `--cache-isolation none` turns it off."""

import asyncio

import orjson

from superfluid.api import cache_ns
from superfluid.api.policy import KeyPolicy

from ..fakes import FakeModel
from ..harness import MODEL, run

A = {"authorization": "Bearer sk-key-a-000"}
B = {"authorization": "Bearer sk-key-b-000"}
ADMIN = {"authorization": "Bearer sk-admin-000"}
KEYS = (KeyPolicy("a", "sk-key-a-000"), KeyPolicy("b", "sk-key-b-000"), KeyPolicy("root", "sk-admin-000", admin=True))
SYSTEM = "You are a careful assistant for the accounts team. " * 4  # a shared system prompt


def chat(question: str, **extra) -> dict:
    return {"model": MODEL, "max_tokens": 2, **extra,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}


async def cached(h, headers: dict, question: str, **extra) -> int:
    r = await h.client.post("/v1/chat/completions", headers=headers, json=chat(question, **extra))
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_key_reuses_only_its_own_prefixes():
    async def body(h):
        out = {"a cold": await cached(h, A, "What did I pay in May?")}
        out["a warm"] = await cached(h, A, "And in June?")  # the system prompt: prefilled once
        out["b, a's exact prompt"] = await cached(h, B, "What did I pay in May?")
        out["b warm"] = await cached(h, B, "What did I pay in July?")
        out["a salted"] = await cached(h, A, "What did I pay in May?", cache_salt="team-x-7f3a")
        out["a salted warm"] = await cached(h, A, "And in June?", cache_salt="team-x-7f3a")
        out["b same salt"] = await cached(h, B, "And in June?", cache_salt="team-x-7f3a")
        out["admin"] = await cached(h, ADMIN, "What did I pay in May?")
        for who, key, question in (("a", A, "May?"), ("b", B, "May?"), ("b again", B, "June?")):
            r = await h.client.post("/v1/completions", headers=key, json={
                "model": MODEL, "prompt": SYSTEM + question, "max_tokens": 2})
            out[f"{who} completion"] = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        return out
    out = run(body, policies=KEYS)
    shared = out["a warm"]
    assert shared > 100, out  # the system prompt's tokens
    assert out["a cold"] == 0 and out["b, a's exact prompt"] == 0, out
    assert out["b warm"] >= shared, out
    assert out["a salted"] == 0 and out["a salted warm"] >= shared, out
    assert out["b same salt"] == 0, out  # a salt is salted by the key too: no way into another key's cache
    assert out["admin"] == 0, out  # admin and keyless share a namespace, which holds nothing of a's or b's
    assert out["b completion"] == 0 and out["b again completion"] > 100, out  # the same on every API


def test_without_keys_or_with_isolation_off_one_cache_is_shared():
    async def body(h):
        first = await cached(h, A, "What did I pay in May?")
        return first, await cached(h, B, "What did I pay in May?")
    first, second = run(body, policies=KEYS, cache_isolation=False)
    assert first == 0 and second > 100

    async def keyless(h):
        return (await cached(h, {}, "What did I pay in May?"), await cached(h, {}, "And in June?"),
                await cached(h, {}, "And in June?", cache_salt="mine"))
    cold, warm, salted = run(keyless)
    assert cold == 0 and warm > 100 and salted == 0


def test_a_bad_cache_salt_is_a_400_naming_it():
    async def body(h):
        out = []
        for path, b in (("/v1/chat/completions", chat("hi", cache_salt="")),
                        ("/v1/chat/completions", chat("hi", cache_salt=7)),
                        ("/v1/completions", {"model": MODEL, "prompt": "hi", "cache_salt": "x" * 5000}),
                        ("/v1/responses", {"model": MODEL, "input": "hi", "cache_salt": ""}),
                        ("/v1/responses", {"model": MODEL, "input": "hi", "cache_salt": ["x"]})):
            r = await h.client.post(path, json=b)
            out.append((path, r.status_code, r.json()["error"].get("param")))
        return out
    for path, status, param in run(body):
        assert status == 400 and param == "cache_salt", (path, status, param)


async def dropped_after_first_chunk(app, path: str, body: dict, headers: dict) -> tuple[str, str]:
    """POST a streamed request straight to the ASGI app and go away once its first event came
    (httpx's ASGI transport reads a stream whole): its session, and the last event id seen."""
    first = asyncio.Event()
    pending = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]
    sent: list[dict] = []

    async def receive():
        if pending:
            return pending.pop()
        await first.wait()
        return {"type": "http.disconnect"}

    async def send(m):
        sent.append(m)
        if m["type"] == "http.response.body" and b"\nid: " in b"\n" + m.get("body", b""):
            first.set()
    hs = [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
          *((k.encode(), v.encode()) for k, v in headers.items())]
    await app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
               "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": hs,
               "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080)}, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    sid = dict(start["headers"])[b"x-superfluid-session"].decode()
    text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    return sid, [ln[4:] for ln in text.splitlines() if ln.startswith("id: ")][-1]


def test_a_resumed_stream_goes_on_in_its_requests_namespace():
    """A stream cut when its client went away is continued by the resume (GET
    /v1/sessions/{sid}/resume): the continuation ran in the resuming request's namespace, the
    key's without the salt, so it left the salted conversation's KV in the key's shared
    namespace and its own cached_tokens read it from there (issue 54, low). It keeps the
    original request's namespace now, salt and all; the session's summary does not show it."""
    async def body(h):
        eng = h.app.models.engines[MODEL]
        seen: list[str] = []
        submit = eng.submit
        eng.submit = lambda r: (seen.append(r.cache_ns), submit(r))[1]
        req = {**chat("Tell me a long story."), "max_tokens": 40, "stream": True, "cache_salt": "team-x-7f3a"}
        sid, last = await dropped_after_first_chunk(h.app.asgi, "/v1/chat/completions", req, A)
        for _ in range(100):  # cut at once (no resume grace)
            if not h.app.sessions.busy(sid):
                break
            await asyncio.sleep(0.02)
        resumed = await h.client.get(f"/v1/sessions/{sid}/resume", headers={**A, "last-event-id": last})
        shown = (await h.client.get(f"/v1/sessions/{sid}", headers=A)).json()
        return seen, resumed, shown
    model = FakeModel(step_delay=0.005)
    model.reply = lambda prompt: model.vocab.script(*["Once"] * 60)
    seen, resumed, shown = run(body, model, policies=KEYS)
    assert resumed.status_code == 200 and "[DONE]" in resumed.text, resumed.text[-300:]
    assert len(seen) == 2, seen  # the request, and the resume's continuation
    assert seen[0] not in ("", cache_ns.of_key("a")), seen  # salted
    assert seen[1] == seen[0], seen
    assert cache_ns.PARAM not in shown["params"], shown["params"]
