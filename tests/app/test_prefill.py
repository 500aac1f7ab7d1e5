"""A final assistant message continued, in one process (tests/harness.py): Anthropic's
prefill, vLLM's continue_final_message and llama-server's assistant prefill. The prompt is
the conversation before it, the assistant-turn opener, then its text as text; the reply is
what follows; the exclusive and impossible asks are 400s naming the field."""

from ..harness import MODEL, run

USER = {"role": "user", "content": "What is the best book?"}
PREFILL = "Whill <|im_end|>"  # chat markers in a prefill stay text


async def tokens(h, text: str) -> int:
    r = await h.client.post("/tokenize", json={"model": MODEL, "content": text, "parse_special": False})
    return len(r.json()["tokens"])


async def chat(h, messages: list, **extra):
    return await h.client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 3, "messages": messages,
                                                             **extra})


def test_openai_chat_continues_a_final_assistant_message():
    async def body(h):
        base = (await chat(h, [USER])).json()["usage"]["prompt_tokens"]
        pre = await tokens(h, PREFILL)
        cont = await chat(h, [USER, {"role": "assistant", "content": PREFILL}])
        explicit = await chat(h, [USER, {"role": "assistant", "content": PREFILL}], continue_final_message=True,
                              add_generation_prompt=False)
        new_turn = await chat(h, [USER, {"role": "assistant", "content": PREFILL}], continue_final_message=False)
        both = await chat(h, [USER, {"role": "assistant", "content": "Hi"}], continue_final_message=True,
                          add_generation_prompt=True)
        no_assistant = await chat(h, [USER], continue_final_message=True)
        return base, pre, cont, explicit, new_turn, both, no_assistant
    base, pre, cont, explicit, new_turn, both, no_assistant = run(body)
    assert cont.status_code == 200, cont.text
    assert cont.json()["usage"]["prompt_tokens"] == base + pre  # opener, then the prefill's text
    assert cont.json()["choices"][0]["message"]["content"] == "Hello world."  # only what follows it
    assert explicit.json()["usage"]["prompt_tokens"] == base + pre
    assert new_turn.json()["usage"]["prompt_tokens"] > base + pre  # the turn closes, a new one opens
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    assert no_assistant.status_code == 400 and no_assistant.json()["error"]["param"] == "messages"


def total(message: dict) -> int:
    """The prompt's tokens (Anthropic counts cache reads apart)."""
    return message["usage"]["input_tokens"] + message["usage"].get("cache_read_input_tokens", 0)


def test_anthropic_prefill_continues_and_refuses_trailing_whitespace():
    async def body(h):
        async def msg(messages):
            return await h.client.post("/v1/messages", json={"model": MODEL, "max_tokens": 3, "messages": messages})
        base = total((await msg([USER])).json())
        pre = await tokens(h, "{")
        cont = await msg([USER, {"role": "assistant", "content": [{"type": "text", "text": "{"}]}])
        spaced = await msg([USER, {"role": "assistant", "content": "Sure, "}])
        return base, pre, cont, spaced
    base, pre, cont, spaced = run(body)
    assert cont.status_code == 200, cont.text
    assert total(cont.json()) == base + pre
    assert cont.json()["content"][0]["text"] == "Hello world."
    assert spaced.status_code == 400 and spaced.json()["error"]["type"] == "invalid_request_error"
    assert "trailing whitespace" in spaced.json()["error"]["message"]
