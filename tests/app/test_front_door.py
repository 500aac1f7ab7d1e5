"""The whole app's front door in one process (the real app, httpx's ASGI transport, a fake
model): with an API key the web page and its files are served without one, as llama-server
serves its own, while every route with data still needs it; pages on this machine's other
ports get CORS answers and can chat; with keys and no --cors-origins, any page may ask (it
needs the key the user gives it, as llama-server's default); named origins narrow that, and
then a foreign page gets no grant and changes nothing; a rebound Host is refused."""

import socket

from superfluid import __version__
from superfluid.api.policy import KeyPolicy

from ..fakes import FakeModel
from ..harness import run

KEY = "sk-front-door-key"
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
PREFLIGHT = {"access-control-request-method": "POST",
             "access-control-request-headers": "authorization, content-type, anthropic-version"}


def serve(body, **kw):
    """The daemon in one process (tests/harness.py), with the web UI and one API key, on a
    fake model; `body(client)`'s result and how many generations reached the model."""
    m = FakeModel()
    prompts: list = []
    script = m.reply
    m.reply = lambda prompt: (prompts.append(prompt), script(prompt))[1]

    async def go(h):
        return await body(h.client), len(prompts)
    return run(go, m, policies=(KeyPolicy("k", KEY),), **kw)


def test_the_page_and_its_files_need_no_key_and_the_data_does():
    async def body(c):
        html = {"accept": "text/html"}
        out = {p: await c.get(p, headers=html) for p in ("/", "/monitor", "/ui/app.css", "/ui/js/api.js")}
        out["probe"] = await c.get("/")  # Ollama's clients (and llama-server's tests) ask without text/html
        out["head"] = await c.head("/")
        for p in ("/sw.js", "/manifest.webmanifest", "/_app/version.json"):  # as llama-server's, keyless
            out[p] = await c.get(p)
        for p in ("/v1/models", "/models", "/v1/monitor", "/v1/sessions", "/metrics", "/api/tags"):
            out[p] = await c.get(p)
            out[p + " keyed"] = await c.get(p, headers=AUTH)
        return out
    r, _ = serve(body)
    assert r["/"].status_code == 200 and r["/"].text.startswith("<!doctype html>")
    assert "script-src 'self'" in r["/"].headers["content-security-policy"]
    for p in ("/monitor", "/ui/app.css", "/ui/js/api.js"):
        assert r[p].status_code == 200, p
    assert "401" in r["/ui/js/api.js"].text  # the page asks for a key when the API answers 401
    assert r["probe"].status_code == 200 and r["probe"].text == "Ollama is running"
    assert r["head"].status_code == 200
    assert r["/sw.js"].status_code == 200 and r["/sw.js"].headers["content-type"].startswith("text/javascript")
    assert "respondWith" in r["/sw.js"].text
    assert r["/manifest.webmanifest"].json()["start_url"] == "/"
    assert r["/manifest.webmanifest"].headers["content-type"] == "application/manifest+json"
    assert r["/_app/version.json"].json() == {"version": __version__}
    for p in ("/v1/models", "/models", "/v1/monitor", "/v1/sessions", "/metrics", "/api/tags"):
        assert r[p].status_code == 401 and r[p].json()["error"]["code"] == "invalid_api_key", p
        # every key's readings (/metrics, /v1/monitor) are an admin key's alone
        assert r[p + " keyed"].status_code == (403 if p in ("/v1/monitor", "/metrics") else 200), p


def test_a_page_on_another_loopback_port_gets_cors_answers_and_chats():
    async def body(c):
        out = {}
        for origin in ("http://localhost:8080", "http://127.0.0.1:3000", "http://[::1]", "http://[::1]:5173"):
            out[origin] = await c.options("/v1/chat/completions", headers={"origin": origin, **PREFLIGHT})
        page = {"origin": "http://localhost:3000"}
        out["chat"] = await c.post("/v1/chat/completions", json=CHAT, headers={**page, **AUTH})
        out["no key"] = await c.get("/v1/models", headers=page)
        return out
    r, generations = serve(body)
    for origin in ("http://localhost:8080", "http://127.0.0.1:3000", "http://[::1]", "http://[::1]:5173"):
        h = r[origin].headers
        assert r[origin].status_code == 200 and h["access-control-allow-origin"] == origin, origin
        assert h["access-control-allow-headers"] == "authorization, content-type, anthropic-version"
        assert "POST" in h["access-control-allow-methods"] and "origin" in h["vary"]
    chat = r["chat"]
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "Hello world."
    assert chat.headers["access-control-allow-origin"] == "http://localhost:3000" and chat.headers["vary"] == "origin"
    assert r["no key"].status_code == 401  # and the page may read it, to ask for the key
    assert r["no key"].headers["access-control-allow-origin"] == "http://localhost:3000"
    assert generations == 1


def test_a_foreign_page_gets_no_grant_and_changes_nothing():
    async def body(c):
        evil = {"origin": "https://evil.example"}
        return {"preflight": await c.options("/v1/chat/completions", headers={**evil, **PREFLIGHT}),
                "simple": await c.post("/v1/chat/completions", content=b'{"model": "fake"}',
                                       headers={**evil, **AUTH, "content-type": "text/plain"}),
                "json": await c.post("/v1/chat/completions", json=CHAT, headers={**evil, **AUTH}),
                "read": await c.get("/v1/models", headers={**evil, **AUTH}),
                "page": await c.get("/", headers={**evil, "accept": "text/html"}),
                "named": await c.post("/v1/chat/completions", json=CHAT,
                                      headers={"origin": "https://app.example", **AUTH})}
    r, generations = serve(body, cors_origins=("https://app.example",))
    assert r["preflight"].status_code == 200
    assert not [k for k in r["preflight"].headers if k.startswith("access-control-")]
    for name in ("simple", "json", "read", "page"):
        assert r[name].status_code == 403, name
        assert "access-control-allow-origin" not in r[name].headers, name
    assert r["named"].status_code == 200 and r["named"].headers["access-control-allow-origin"] == "https://app.example"
    assert generations == 1  # the named origin's; none of the foreign page's


def test_with_keys_and_no_cors_origins_any_page_may_ask_but_needs_the_key():
    async def body(c):
        page = {"origin": "https://chat.example"}
        return {"preflight": await c.options("/v1/chat/completions", headers={**page, **PREFLIGHT}),
                "no key": await c.post("/v1/chat/completions", json=CHAT, headers=page),
                "chat": await c.post("/v1/chat/completions", json=CHAT, headers={**page, **AUTH}),
                "simple": await c.post("/v1/chat/completions", content=b'{"model": "fake"}',
                                       headers={**page, **AUTH, "content-type": "text/plain"}),
                "null": await c.post("/v1/chat/completions", json=CHAT, headers={"origin": "null", **AUTH}),
                "page": await c.get("/", headers={**page, "accept": "text/html"})}
    r, generations = serve(body)
    h = r["preflight"].headers
    assert r["preflight"].status_code == 200 and h["access-control-allow-origin"] == "https://chat.example"
    assert h["access-control-allow-credentials"] == "true"  # harmless: no credential here is ambient
    assert r["no key"].status_code == 401 and r["no key"].headers["access-control-allow-origin"] == \
        "https://chat.example"  # the page can read why, and ask for the key
    assert r["chat"].status_code == 200 and r["chat"].headers["access-control-allow-origin"] == "https://chat.example"
    assert r["simple"].status_code == 415  # a state change from a page is still JSON only
    assert r["null"].status_code == 403 and r["page"].status_code == 403  # our own page is ours alone
    assert generations == 1


def test_a_rebound_host_is_refused_on_the_page_and_the_api():
    async def body(c):
        rebound = {"host": "evil.example:8080"}
        return [await c.get("/", headers={**rebound, "accept": "text/html"}), await c.get("/", headers=rebound),
                await c.get("/v1/models", headers={**rebound, **AUTH}),
                await c.options("/v1/models", headers={**rebound, "origin": "http://localhost:3000", **PREFLIGHT})]
    r, _ = serve(body)
    assert [x.status_code for x in r] == [403, 403, 403, 403]
    assert "DNS rebinding" in r[2].json()["error"]["message"]


def test_the_metrics_and_the_monitor_are_an_admin_keys_alone():
    """/metrics and /v1/monitor show every key's traffic (and /metrics its accepted drafts,
    an oracle on another key's output: issue 54): with keys, only an admin key reads them;
    a server without keys still serves them to any client (issue 54, low)."""
    admin = "sk-front-door-admin"

    async def body(h):
        out = {}
        for p in ("/metrics", "/v1/monitor"):
            out[p] = await h.client.get(p, headers=AUTH)
            out[p + " admin"] = await h.client.get(p, headers={"authorization": f"Bearer {admin}"})
        return out
    r = run(body, policies=(KeyPolicy("k", KEY), KeyPolicy("root", admin, admin=True)))
    for p in ("/metrics", "/v1/monitor"):
        assert r[p].status_code == 403 and r[p].json()["error"]["type"] == "permission_error", p
        assert r[p + " admin"].status_code == 200, p

    async def keyless(h):
        return [(await h.client.get(p)).status_code for p in ("/metrics", "/v1/monitor")]
    assert run(keyless) == [200, 200]


def test_a_keyless_server_on_the_network_answers_only_addresses_and_its_own_names():
    """DNS rebinding on a LAN bind (issue 54, low): a page on evil.example whose name the
    attacker then points at this server's address reads its answers as same-origin. Loopback
    servers refused a Host that is not loopback already; a server bound to the network without
    keys answered any Host. It now answers IP literals, localhost and its own names (the bind
    name, this machine's hostname and its .local) only, on the API and the page; one with keys
    needs no Host rule (a page has no key unless the user gave it one)."""
    me = socket.gethostname().split(".")[0]
    hosts = ("evil.example:8080", "192.168.1.5:8080", "[fe80::1]:8080", "10.0.0.2", "localhost:8080",
             f"{me}:8080", f"{me}.local", "llm.lan:8080", "127.0.0.1.evil.example")

    async def body(h):
        out = {}
        for host in hosts:
            out[host] = (await h.client.get("/v1/models", headers={"host": host, **AUTH})).status_code
            out[host + " page"] = (await h.client.get("/", headers={"host": host, "accept": "text/html"})).status_code
        return out
    lan = run(body, host="0.0.0.0")
    refused = {"evil.example:8080", "llm.lan:8080", "127.0.0.1.evil.example"}
    for host in hosts:
        want = 403 if host in refused else 200
        assert lan[host] == want and lan[host + " page"] == want, (host, lan[host], lan[host + " page"])
    named = run(body, host="llm.lan")  # a bind by name answers that name
    assert named["llm.lan:8080"] == 200 and named["evil.example:8080"] == 403
    keyed = run(body, host="0.0.0.0", policies=(KeyPolicy("k", KEY),))
    assert keyed["evil.example:8080"] == 200 and keyed["llm.lan:8080"] == 200
