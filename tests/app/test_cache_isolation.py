"""The prefix cache is no oracle across keys (issue 33): in one process (tests/harness.py),
with the real scheduler's KV slots. Key B sending key A's exact prompt reuses none of it
(`cached_tokens` 0), while each key's own shared system prompt is still prefilled once; a
`cache_salt` (vLLM's field) makes a namespace of its own; an admin key and a server without
keys share one; `--cache-isolation none` turns it off."""

from superfluid.api.policy import KeyPolicy

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
