"""llama-server's `grammar` (GBNF) and `json_schema` on the OpenAI routes, as llama-server
honours them there, in one process (tests/harness.py): the fake model's reply is held to the
grammar, a grammar that does not parse is a typed 400 naming `grammar`, and `grammar` wins
over `response_format` as on /completion."""

from ..harness import MODEL, run

MSGS = [{"role": "user", "content": "hi"}]
YES_NO = 'root ::= "yes" | "no"'


def test_grammar_and_json_schema_hold_chat_and_completions_output():
    async def body(h):
        c = h.client
        return {
            "chat": await c.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 8,
                                                              "grammar": YES_NO}),
            "both": await c.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 8,
                                                              "grammar": YES_NO,
                                                              "response_format": {"type": "json_object"}}),
            "completion": await c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 8,
                                                               "grammar": YES_NO}),
            "schema": await c.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 30,
                                                                "json_schema": {"const": "ok"}}),
            "plain": await c.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 8}),
            "bad": await c.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS,
                                                             "grammar": "root ::= nothing-defined"}),
            "wrong type": await c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "grammar": 5}),
        }
    r = run(body)
    for k in ("chat", "both"):
        assert r[k].status_code == 200, r[k].text
        assert r[k].json()["choices"][0]["message"]["content"] in ("yes", "no"), k
    assert r["completion"].json()["choices"][0]["text"] in ("yes", "no")
    assert r["schema"].json()["choices"][0]["message"]["content"] == '"ok"'
    assert r["plain"].json()["choices"][0]["message"]["content"] == "Hello world."  # the grammar was the cause
    for k in ("bad", "wrong type"):
        assert r[k].status_code == 400 and r[k].json()["error"]["param"] == "grammar", (k, r[k].text)
