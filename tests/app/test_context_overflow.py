"""A prompt over the window, on every API, in one process (tests/harness.py): a typed 400
that OpenAI's and llama-server's clients both recognise (code `context_length_exceeded`,
type `exceed_context_size_error`, `n_prompt_tokens` and `n_ctx`), Anthropic's and Ollama's
own error shapes, and the daemon still answering."""

from ..fakes import FakeModel
from ..harness import MODEL, run

LONG = "word " * 700  # over the fake model's 512-token window
MSGS = [{"role": "user", "content": LONG}]


def test_a_prompt_over_the_window_is_the_same_typed_400_on_every_api():
    async def body(h):
        c = h.client
        out = {p: await c.post(p, json={"model": MODEL, **b}) for p, b in [
            ("/v1/chat/completions", {"messages": MSGS}),
            ("/v1/completions", {"prompt": LONG, "max_tokens": 4}),
            ("/completion", {"prompt": LONG, "n_predict": 4}),
            ("/v1/messages", {"messages": MSGS, "max_tokens": 4}),
            ("/api/chat", {"messages": MSGS, "stream": False}),
        ]}
        out["after"] = await c.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        return out
    r = run(body)
    for path in ("/v1/chat/completions", "/v1/completions", "/completion"):
        assert r[path].status_code == 400, (path, r[path].text)
        err = r[path].json()["error"]
        code = 400 if path == "/completion" else "context_length_exceeded"  # llama-server's own: the status
        assert err["code"] == code and err["type"] == "exceed_context_size_error", path
        assert err["n_ctx"] == 512 and err["n_prompt_tokens"] > 512, (path, err)
        assert "exceeds the available context size (512 tokens)" in err["message"], path
    anthropic = r["/v1/messages"]
    assert anthropic.status_code == 400 and anthropic.json()["error"]["type"] == "invalid_request_error"
    assert "exceeds the available context size" in anthropic.json()["error"]["message"]
    ollama = r["/api/chat"]
    assert ollama.status_code == 400 and "exceeds the available context size" in ollama.json()["error"]
    assert r["after"].status_code == 200


def test_max_tokens_past_the_window_is_capped_where_the_window_ends():
    """opencode asks max_tokens 32000 whatever the window: the answer ends with `length` where
    the window ends (llama-server's and Ollama's behaviour), on every API; only a prompt that
    does not fit by itself is a 400 (above)."""
    m = FakeModel(reply=lambda prompt: m.vocab.script("Hello world." * 100))
    prompt = "word " * 80  # 400 of the fake model's 512 tokens, with the template's

    async def body(h):
        c = h.client
        return [await c.post(p, json={"model": MODEL, **b}) for p, b in [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 32000}),
            ("/v1/completions", {"prompt": prompt, "max_tokens": 32000}),
            ("/v1/messages", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 32000}),
        ]]
    chat, completion, messages = run(body, m)
    for r in (chat, completion):
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["choices"][0]["finish_reason"] == "length"
        assert b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"] == 512, b["usage"]
    assert messages.status_code == 200, messages.text
    b = messages.json()
    assert b["stop_reason"] == "max_tokens"
    u = b["usage"]  # Anthropic's input_tokens leave out the cached ones
    assert u["input_tokens"] + (u.get("cache_read_input_tokens") or 0) + u["output_tokens"] == 512, u
