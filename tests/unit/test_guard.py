"""The front door (ASGI middleware) driven with hand-made scopes: no sockets."""

import os
import asyncio

import orjson

from superfluid.api.guard import Guard, is_loopback_host
from superfluid.api.policy import KeyPolicy
from superfluid.request import Qos


class App:
    def __init__(self):
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, scope, receive, send):
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(guard, path="/v1/models", headers=None, client="127.0.0.1"):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(m):
        sent.append(m)

    hs = [(k.encode(), v.encode()) for k, v in {"host": "127.0.0.1:8453", **(headers or {})}.items()]
    scope = {"type": "http", "path": path, "headers": hs, "client": (client, 5000)}
    asyncio.run(guard(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


KEYS = [KeyPolicy("a", "sk-aaaaaaaa"), KeyPolicy("lim", "sk-llllllll", qos=Qos.BACKGROUND,
                                                 max_qos=Qos.AGENT, rpm=2)]


def test_loopback_hosts():
    for h in ("127.0.0.1", "127.0.0.1:8453", "localhost:1", "[::1]:80", "app.localhost"):
        assert is_loopback_host(h), h
    for h in ("evil.example", "10.0.0.1:8453", "0.0.0.0", "[2001:db8::1]:80"):
        assert not is_loopback_host(h), h


def test_no_keys_no_checks_but_browser_rules():
    g = Guard(App(), policies=[], loopback_bind=True)
    assert call(g)[0] == 200
    assert call(g, headers={"origin": "http://localhost:3000"})[0] == 200
    status, _, body = call(g, headers={"origin": "https://evil.example"})
    assert status == 403 and b"cross-origin" in body
    assert call(g, headers={"host": "evil.example:8453"})[0] == 403  # DNS rebinding
    assert call(g, path="/health", headers={"host": "evil.example"})[0] == 403  # browsers never pass


def test_host_check_only_on_a_loopback_bind():
    g = Guard(App(), policies=[], loopback_bind=False)
    assert call(g, headers={"host": "my-box.lan:8453"})[0] == 200


def test_keys_required_except_health():
    app = App()
    g = Guard(app, policies=KEYS, loopback_bind=True)
    status, _, body = call(g)
    assert status == 401 and orjson.loads(body)["error"]["code"] == "invalid_api_key"
    assert call(g, headers={"authorization": "Bearer sk-wrongggg"})[0] == 401
    assert call(g, path="/health")[0] == 200
    assert call(g, path="/")[0] == 200  # Ollama's probe, like llama-server's page, needs no key
    assert call(g, headers={"authorization": "Bearer sk-aaaaaaaa"})[0] == 200
    assert call(g, headers={"x-api-key": "sk-aaaaaaaa"})[0] == 200


def test_qos_ceiling():
    g = Guard(App(), policies=KEYS, loopback_bind=True)
    hdr = {"x-api-key": "sk-llllllll"}
    status, _, body = call(g, headers={**hdr, "x-superfluid-qos": "interactive"})
    assert status == 403 and b"agent at best" in body
    assert call(g, headers={**hdr, "x-superfluid-qos": "agent"})[0] == 200


def test_requests_per_minute_with_retry_after():
    now = [1000.0]
    g = Guard(App(), policies=KEYS, loopback_bind=True, clock=lambda: now[0])
    hdr = {"x-api-key": "sk-llllllll"}
    assert call(g, headers=hdr)[0] == 200
    assert call(g, headers=hdr)[0] == 200
    status, headers, _ = call(g, headers=hdr)
    assert status == 429 and int(headers[b"retry-after"]) == 60
    now[0] += 61
    assert call(g, headers=hdr)[0] == 200
    assert call(g, headers={"x-api-key": "sk-aaaaaaaa"})[0] == 200  # other keys unaffected


def test_per_ip_rate_limit():
    g = Guard(App(), policies=[], loopback_bind=True, ip_rpm=1)
    assert call(g, client="127.0.0.1")[0] == 200
    assert call(g, client="127.0.0.1")[0] == 429
    assert call(g, client="127.0.0.2")[0] == 200


def test_concurrency_limit_holds_while_a_response_runs():
    app = App()
    g = Guard(app, policies=[KeyPolicy("c", "sk-cccccccc", max_concurrent=1)], loopback_bind=True)

    async def scenario():
        app.gate = asyncio.Event()
        sent = []

        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(m):
            sent.append(m)

        scope = {"type": "http", "path": "/v1/x", "client": ("127.0.0.1", 1),
                 "headers": [(b"host", b"127.0.0.1"), (b"x-api-key", b"sk-cccccccc")]}
        first = asyncio.create_task(g(dict(scope), receive, send))
        await asyncio.sleep(0)
        second_sent = []

        async def send2(m):
            second_sent.append(m)

        await g(dict(scope), receive, send2)
        app.gate.set()
        await first
        third = []

        async def send3(m):
            third.append(m)

        await g(dict(scope), receive, send3)
        return second_sent[0]["status"], sent[0]["status"], third[0]["status"]

    assert asyncio.run(scenario()) == (429, 200, 200)


def test_the_embedding_class_ranks_between_agent_and_background_for_a_key_s_best_class():
    from superfluid.api.guard import Guard

    bg_only = KeyPolicy("bg", "sk-bbbbbbbb", qos=Qos.BACKGROUND, max_qos=Qos.BACKGROUND)
    assert Guard._qos_check(bg_only, {"x-superfluid-qos": "embedding"}) is not None  # better than background
    assert Guard._qos_check(bg_only, {"x-superfluid-qos": "background"}) is None
    agent = KeyPolicy("ag", "sk-gggggggg", max_qos=Qos.AGENT)
    assert Guard._qos_check(agent, {"x-superfluid-qos": "4"}) is None
    assert Guard._qos_check(agent, {"x-superfluid-qos": "completion"}) is not None


def call_raw(guard, method="GET", path="/v1/models", headers=()):
    """Like call, with a method and a header list (a header may repeat)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(m):
        sent.append(m)

    hs = [(b"host", b"127.0.0.1:8453")] + [(k.encode(), v.encode()) for k, v in headers]
    asyncio.run(guard({"type": "http", "method": method, "path": path, "headers": hs, "client": ("127.0.0.1", 1)},
                      receive, send))
    return sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0]["headers"]}


def test_cors_for_pages_on_this_machine_and_named_origins_only():
    app = App()
    g = Guard(app, policies=[], loopback_bind=True, cors_origins=("https://app.example",))
    status, h = call_raw(g, headers=[("origin", "http://localhost:3000")])
    assert status == 200 and h["access-control-allow-origin"] == "http://localhost:3000"
    assert h["vary"] == "origin" and "x-superfluid-session" in h["access-control-expose-headers"]
    status, h = call_raw(g, "OPTIONS", "/v1/chat/completions", [("origin", "http://127.0.0.1:5173"),
                                                                 ("access-control-request-method", "POST")])
    assert status == 200 and h["access-control-allow-origin"] == "http://127.0.0.1:5173"
    assert "POST" in h["access-control-allow-methods"] and "authorization" in h["access-control-allow-headers"]
    assert "origin" in h["vary"] and h["access-control-allow-credentials"] == "true"
    assert call_raw(g, headers=[("origin", "https://app.example")])[1]["access-control-allow-origin"] == \
        "https://app.example"
    calls = app.calls
    for bad in ("null", "https://evil.example", "file://", "http://localhost.evil.example", "http://notlocalhost",
                "localhost"):
        assert call_raw(g, "POST", "/v1/models/load", [("origin", bad)])[0] == 403, bad
        # a preflight gets a 2xx without any grant, so the browser sends nothing more
        status, h = call_raw(g, "OPTIONS", "/v1/models/load", [("origin", bad), ("access-control-request-method",
                                                                                  "POST")])
        assert status == 200 and not [k for k in h if k.startswith("access-control-")], bad
    assert app.calls == calls  # none of them reached the app
    assert "access-control-allow-origin" not in call_raw(g)[1]  # no Origin, no CORS headers


def test_a_browsers_state_change_must_be_json_and_control_headers_come_once():
    g = Guard(App(), policies=KEYS, loopback_bind=True)
    key = ("authorization", "Bearer sk-aaaaaaaa")
    page = ("origin", "http://localhost:3000")
    assert call_raw(g, "POST", "/v1/models/unload", [key, page, ("content-type", "text/plain")])[0] == 415
    assert call_raw(g, "POST", "/v1/chat/completions", [key, page, ("content-type", "application/json")])[0] == 200
    assert call_raw(g, "POST", "/v1/chat/completions", [key, ("content-type", "text/plain")])[0] == 200  # curl -d
    status, _ = call_raw(g, "POST", "/v1/chat/completions", [key, ("x-superfluid-qos", "background"),
                                                             ("x-superfluid-qos", "interactive")])
    assert status == 400
    assert call_raw(g, headers=[key, ("authorization", "Bearer sk-llllllll")])[0] == 400


def test_idle_client_windows_are_pruned():
    from superfluid.api import guard as guard_mod
    now = [0.0]
    g = Guard(App(), policies=[], loopback_bind=True, ip_rpm=5, clock=lambda: now[0])
    for i in range(guard_mod.MAX_IP_WINDOWS + 10):
        call(g, client=f"10.0.{i // 250}.{i % 250}")
    now[0] = 120.0
    call(g, client="10.9.9.9")
    assert len(g._ip_windows) <= 2


def test_the_worker_gets_no_secrets():
    from superfluid.worker.supervisor import worker_env
    env = worker_env({"PATH": "/bin", "SUPERFLUID_API_KEY": "sk", "SUPERFLUID_FLEET_TOKEN": "t", "HF_TOKEN": "h",
                      "AWS_SECRET_ACCESS_KEY": "s", "SUPERFLUID_HOME": "/h", "OMP_WAIT_POLICY": "PASSIVE"})
    assert env == {"PATH": "/bin", "SUPERFLUID_HOME": "/h", "OMP_WAIT_POLICY": "PASSIVE"}


def test_the_workers_threads_wait_passively_unless_the_operator_says_otherwise():
    from superfluid.config import default_threads
    from superfluid.worker.supervisor import worker_env
    assert worker_env({"PATH": "/bin"}) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert worker_env({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    assert default_threads() == len(os.sched_getaffinity(0))  # every core this process may use


PREFLIGHT = [("access-control-request-method", "POST"),
             ("access-control-request-headers", "Authorization, Content-Type, anthropic-version, x-stainless-os")]


def test_a_page_on_any_loopback_origin_is_granted_the_headers_it_asks_for():
    g = Guard(App(), policies=KEYS, loopback_bind=True, cors_origins=("localhost",))  # llama-server's word
    for origin in ("http://localhost", "http://localhost:8080", "https://localhost:8443", "http://127.0.0.1:3000",
                   "http://127.0.0.2:9000", "http://[::1]", "http://[::1]:5173", "http://app.localhost:3000"):
        status, h = call_raw(g, "OPTIONS", "/v1/messages", [("origin", origin), *PREFLIGHT])
        assert status == 200 and h["access-control-allow-origin"] == origin, origin
        assert h["access-control-allow-headers"] == "authorization, content-type, anthropic-version, x-stainless-os"
        status, h = call_raw(g, "POST", "/v1/chat/completions", [("origin", origin), ("content-type",
                                                                 "application/json"), ("x-api-key", "sk-aaaaaaaa")])
        assert status == 200 and h["access-control-allow-origin"] == origin and h["vary"] == "origin", origin
    # its 401 carries the grant too, so the page can read it and ask for a key
    status, h = call_raw(g, "GET", "/v1/models", [("origin", "http://localhost:3000")])
    assert status == 401 and h["access-control-allow-origin"] == "http://localhost:3000"
    # a header list that is not header names is not echoed
    status, h = call_raw(g, "OPTIONS", "/v1/models", [("origin", "http://localhost:3000"),
                                                      ("access-control-request-method", "GET"),
                                                      ("access-control-request-headers", "a b, x-ok")])
    assert h["access-control-allow-headers"] == "x-ok"


def test_a_loopback_origin_still_cannot_rebind_the_host_nor_post_a_simple_body():
    app = App()
    g = Guard(app, policies=[], loopback_bind=True)
    origin = ("origin", "http://localhost:3000")
    rebound = [("origin", "http://localhost:3000"), ("host", "evil.example")]
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(m):
        sent.append(m)

    for method, extra in (("OPTIONS", PREFLIGHT), ("GET", [])):
        scope = {"type": "http", "method": method, "path": "/v1/models", "client": ("127.0.0.1", 1),
                 "headers": [(k.encode(), v.encode()) for k, v in [*rebound, *extra]]}
        asyncio.run(g(scope, receive, send))
        assert sent[-2]["status"] == 403 and b"DNS rebinding" in sent[-1]["body"]
    status, h = call_raw(g, "POST", "/v1/models/unload", [origin, ("content-type", "text/plain")])
    assert status == 415 and h["access-control-allow-origin"] == "http://localhost:3000"  # the page can read why
    assert app.calls == 0
