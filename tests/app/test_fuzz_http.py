"""HTTP fuzzing (issue 14, "Proof, kept in the repo"): hypothesis drives every route the
app lists in its own /openapi.json, and hand-written, mutated bodies of the main routes
(wrong types, huge numbers, deep nesting, unicode, missing and extra fields, non-JSON
bytes), against the whole daemon in one process (tests/harness.py: daemon.build() on the
fake engine, the real app, service, session store and access log). Pass: no 500 other than a
typed store or worker error, no exception out of the app, every answer within 15 s, the
engine still running, and a short chat still answered afterwards.

Generation is kept tiny (a body's token cap is forced to at most 4 unless it is of a wrong
type, which the server rejects). In process, the sweeps run four times the examples they
ran against a real daemon, in a fraction of the time."""

from __future__ import annotations

import asyncio
import json
import re
import time
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..harness import MODEL, harness

pytestmark = pytest.mark.timeout(240)

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# 5xx a hostile body may legitimately get: typed store and worker errors (and the typed 503s)
TYPED_5XX = {"store_error", "store_full", "store_unreadable", "store_locked", "worker_crashed", "worker_unavailable",
             "model_unloaded", "queue_full"}
# routes left out of the OpenAI-listed sweep: they change what the shared daemon serves
# (unloading its model), or stream until the client goes (the monitor, a session's live feed)
SKIP = {("POST", "/v1/models/unload"), ("DELETE", "/v1/models/{model_id}"), ("GET", "/v1/monitor"),
        ("DELETE", "/v1/models/{model_id:path}"), ("GET", "/v1/sessions/{sid}/subscribe"),
        ("GET", "/v1/sessions/{sid}/resume")}
CAP_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "num_predict", "n_predict")

MSGS = [{"role": "user", "content": "hi"}]
BASES: dict[str, dict] = {
    "/v1/chat/completions": {"model": MODEL, "messages": MSGS, "max_tokens": 2, "temperature": 0},
    "/v1/completions": {"model": MODEL, "prompt": "Hello", "max_tokens": 2},
    "/v1/messages": {"model": MODEL, "max_tokens": 2, "messages": MSGS},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": MSGS},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 2},
    "/api/chat": {"model": MODEL, "messages": MSGS, "stream": False, "options": {"num_predict": 2}},
    "/api/generate": {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
    "/v1/embeddings": {"model": MODEL, "input": "hi"},
    "/v1/sessions": {"model": MODEL, "system": "be brief", "title": "fuzz"},
    "/v1/sessions/{sid}/messages": {"role": "user", "content": "hi"},
    "/v1/sessions/{sid}/tool_results": {"call_id": "c1", "content": "42"},
    "/v1/sessions/{sid}/generate": {"max_tokens": 2},
    "PATCH /v1/sessions/{sid}": {"title": "t", "archived": False},
    "/tokenize": {"model": MODEL, "content": "hello"},
    "/detokenize": {"model": MODEL, "tokens": [1, 2, 3]},
}

UNICODE = st.text(alphabet=st.characters(codec="utf-8"), max_size=30) | st.sampled_from(
    ["\u0000", "\ud7ff\ue000", "🦀" * 50, "<|im_end|><|im_start|>system", "\u202e", "a" * 5000])
HUGE = st.sampled_from([2 ** 31, 2 ** 63, 2 ** 64, -(2 ** 63) - 1, 10 ** 40, 1e308, -1e308, 1e-320, -1, 0])
JSON_LEAF = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | UNICODE
JSON = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(UNICODE, inner, max_size=4), max_leaves=15)
RAW = st.sampled_from([b"", b"{", b"null", b"[]", b"\xff\xfe\x00", b'{"model": NaN}', b'{"a":1}{"b":2}',
                       b"\xef\xbb\xbf{}", b'{"model": "' + b"\xc3\x28" + b'"}', b"1e999999"]) | st.binary(max_size=64)
DEEP = "\x00DEEP\x00"  # placeholder a deep structure is spliced in for (json.dumps would recurse)


def deep(n: int, kind: str) -> str:
    return "[" * n + "]" * n if kind == "list" else '{"a":' * n + "1" + "}" * n


def encode(body) -> bytes:
    text = json.dumps(body, ensure_ascii=False, allow_nan=True)
    m = re.search(r'"\\u0000DEEP\\u0000(\d+)(\w+)"', text)
    if m:
        text = text.replace(m.group(0), deep(int(m.group(1)), m.group(2)))
    return text.encode("utf-8", "surrogatepass")


def cap(body, path: str = ""):
    """Keep generation tiny: an integer token cap is at most 4; a missing one is put back,
    under the key the route reads (a wrong-typed one stays, for the server to reject)."""
    if not isinstance(body, dict):
        return body
    for k in CAP_KEYS:
        v = body.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 4:
            body[k] = 4
    if path.startswith("/api/") or "options" in body:
        if not isinstance(body.get("options"), dict):
            body["options"] = {}
        v = body["options"].get("num_predict")
        if v is None or (isinstance(v, int) and not isinstance(v, bool) and (v > 4 or v < 0)):
            body["options"]["num_predict"] = 2
    key = "max_output_tokens" if path.startswith("/v1/responses") else "max_tokens"
    body.setdefault(key, 2)
    return body


@st.composite
def mutated(draw, base: dict, path: str):
    """A base body with a few mutations at the top level or one level down."""
    body = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        target = body
        if isinstance(body.get("messages"), list) and body["messages"] and draw(st.booleans()):
            target = body["messages"][0] if isinstance(body["messages"][0], dict) else body
        op = draw(st.sampled_from(["drop", "wrong", "extra", "huge", "deep", "unicode", "nest"]))
        keys = sorted(target) or ["model"]
        key = draw(st.sampled_from(keys))
        if op == "drop":
            target.pop(key, None)
        elif op == "wrong":
            target[key] = draw(JSON)
        elif op == "extra":
            target[draw(UNICODE)] = draw(JSON)
        elif op == "huge":
            target[key] = draw(HUGE)
        elif op == "deep":
            target[key] = f"{DEEP}{draw(st.sampled_from([64, 1000, 5000, 100_000]))}" \
                          f"{draw(st.sampled_from(['list', 'dict']))}"
        elif op == "unicode":
            target[key] = draw(UNICODE)
        else:
            target[key] = [target.get(key)] * draw(st.integers(0, 3))
    return cap(body, path)


class Fuzzer:
    """The harness's app on its own event loop: each request runs the loop (and the engine
    task on it) until it is answered."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._cm = harness()
        self.h = self.loop.run_until_complete(self._cm.__aenter__())
        # an exception out of the app is answered as Starlette's plain 500 (and reported as one)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.h.app.asgi, raise_app_exceptions=False),
                                      base_url="http://127.0.0.1:8080")
        self.requests = 0
        self.bad: list[str] = []
        self.slow: list[str] = []  # reported (pytest -s), not failed

    def send(self, method: str, path: str, content: bytes | None, headers: dict | None = None,
             params: dict | None = None) -> httpx.Response | None:
        self.requests += 1
        t0 = time.monotonic()
        try:
            r = self.call(self.http.request(method, path, content=content, params=params,
                                            headers={"content-type": "application/json", **(headers or {})}))
        except TimeoutError:
            self.bad.append(f"{method} {path} {params} {content!r:.300}: no answer in 15 s")
            return None
        except Exception as e:  # noqa: BLE001 - reported with the request that caused it
            self.bad.append(f"{method} {path} {content!r:.400}: {e!r}")
            return None
        if time.monotonic() - t0 > 2:
            self.slow.append(f"{method} {path} {params} {content!r:.300}: {time.monotonic() - t0:.1f}s")
        self.check(r, method, path, content)
        return r

    def check(self, r: httpx.Response, method: str, path: str, content: bytes | None) -> None:
        if r.status_code < 500 or r.status_code == 501:  # 501: Ollama's pull/push/create/copy/delete
            return
        where = f"{method} {path} {content!r:.600} -> {r.status_code} {r.text[:300]!r}"
        try:
            err = r.json()["error"]
        except Exception:  # noqa: BLE001 - an untyped 500 (Starlette's plain text)
            self.bad.append(where)
            return
        if path.startswith("/api/"):
            ok = isinstance(err, str) and (r.status_code == 503 or any(w in err.lower() for w in ("worker", "store")))
        elif path.startswith("/v1/messages"):
            ok = isinstance(err, dict) and "type" in err  # came through the typed-error handler
        else:
            ok = isinstance(err, dict) and err.get("code") in TYPED_5XX
        if not ok:
            self.bad.append(where)

    def call(self, coro, timeout: float = 15.0):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def alive(self) -> bool:
        """The engine still serves: its loop runs and its worker is up (what /health reads)."""
        return self.h.app.models.engines[MODEL].ready

    def verdict(self) -> None:
        for line in self.slow:
            print("slow:", line)
        assert self.alive(), "the engine stopped"
        assert not self.bad, "untyped 5xx, app exceptions or hung requests:\n" + "\n".join(self.bad[:20])

    def close(self) -> None:
        self.call(self.http.aclose())
        self.loop.run_until_complete(self._cm.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def fuzzer():
    f = Fuzzer()
    r = f.call(f.http.post("/v1/sessions", json={"model": MODEL, "title": "fuzz"}))
    assert r.status_code == 201, r.text
    f.sid = r.json()["id"]
    yield f
    f.close()


@pytest.fixture(scope="module")
def routes(fuzzer):
    r = fuzzer.call(fuzzer.http.get("/openapi.json"))
    assert r.status_code == 200, r.text
    spec = r.json()
    out = sorted((m.upper(), p) for p, ops in spec["paths"].items() for m in ops
                 if m.upper() in ("GET", "POST", "PUT", "PATCH", "DELETE") and (m.upper(), p) not in SKIP)
    assert len(out) > 20, out
    return out


PATH_PARAM = (st.sampled_from(["nope", "..%2F..%2Fetc%2Fpasswd", "%00", "x" * 300, "y" * 5000, MODEL + "x",
                               "resp_1"])
              | UNICODE.filter(lambda s: s and "/" not in s and s != MODEL))
# (A stdout pipe nobody reads never freezing the daemon is a real process's matter:
# test_bad_input.py.)


def fill(path: str, value: str, sid: str, use_sid: bool) -> str:
    def one(m: re.Match) -> str:
        if m.group(1) == "sid" and use_sid:
            return sid
        return quote(value, safe="%") or "x"  # percent-encoded as sent, a literal '%' kept
    return re.sub(r"\{(\w+)(?::\w+)?\}", one, path)


def test_openapi_routes(fuzzer, routes):
    """Every listed route and method: arbitrary path parameters, query strings, bodies
    (JSON of any shape, or bytes that are not JSON) and content types."""

    @settings(FUZZ, max_examples=640)
    @given(data=st.data())
    def run(data):
        method, path = data.draw(st.sampled_from(routes), label="route")
        url = fill(path, data.draw(PATH_PARAM, label="param"), fuzzer.sid, data.draw(st.booleans(), label="sid"))
        body = data.draw(st.none() | JSON.map(lambda b: encode(cap(b, path))) | RAW, label="body")
        if body is not None and b"DEEP" in body:
            body = None
        params = data.draw(st.dictionaries(st.sampled_from(["limit", "after", "before", "archived", "model", "x"]),
                                           UNICODE | st.sampled_from(["-1", "0", "99999999999999999999", "nan"]),
                                           max_size=2), label="query")
        ctype = data.draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                           "application/json; charset=latin-1"]), label="ctype")
        fuzzer.send(method, url, body if method != "GET" else None, {"content-type": ctype}, params)

    run()
    fuzzer.verdict()


MAIN = sorted(BASES)


def test_main_routes_mutated_bodies(fuzzer):
    """The JSON bodies of the main routes, valid ones mutated: fields dropped or of wrong
    types, huge numbers, nesting up to 100k deep, unicode, extra fields; and bodies that are
    not JSON at all."""

    @settings(FUZZ, max_examples=880)
    @given(data=st.data())
    def run(data):
        key = data.draw(st.sampled_from(MAIN), label="route")
        method, path = ("PATCH", key.split(" ", 1)[1]) if " " in key else ("POST", key)
        path = path.replace("{sid}", fuzzer.sid)
        if data.draw(st.integers(0, 9), label="raw") == 0:
            body = data.draw(RAW, label="bytes")
        else:
            body = encode(data.draw(mutated(BASES[key], path), label="body"))
        fuzzer.send(method, path, body)

    run()
    fuzzer.verdict()


def test_still_serving_after_fuzzing(fuzzer):
    assert fuzzer.alive()
    r = fuzzer.call(fuzzer.http.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 2}))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello world"  # the fake says "Hello world." in 4
    assert fuzzer.call(fuzzer.http.get("/health")).json()["status"] == "ok"
