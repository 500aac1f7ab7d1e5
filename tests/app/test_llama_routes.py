"""llama-server's route table, in one process (tests/harness.py): `/completions` without /v1
is its native completion (`content`, `stop`, `timings` ...), as in llama-server, while
`/v1/completions` and `/chat/completions` stay OpenAI's."""

import json

from ..harness import MODEL, run


def test_completions_without_v1_is_the_native_completion():
    async def body(h):
        c = h.client
        return {p: await c.post(p, json=b) for p, b in [
            ("/completions", {"prompt": "hi", "n_predict": 3}),
            ("/completion", {"prompt": "hi", "n_predict": 3}),
            ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3}),
            ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        ]}
    r = run(body)
    native, legacy = r["/completions"].json(), r["/completion"].json()
    assert native["content"] == legacy["content"] == "Hello world."
    assert native["stop"] is True and native["tokens_predicted"] == 3 and "timings" in native
    assert set(native) == set(legacy)
    assert r["/v1/completions"].json()["object"] == "text_completion"
    assert r["/chat/completions"].json()["object"] == "chat.completion"


def test_a_huge_tokenize_never_holds_up_other_requests():
    """/tokenize and /detokenize run off the event loop: /health answers while a body of
    megabytes is being tokenized."""
    import asyncio

    async def body(h):
        c, order = h.client, []

        async def big():
            r = await c.post("/tokenize", json={"content": "hello world " * 40_000, "with_pieces": True})
            order.append(("tokenize", r.status_code, r.json()["count"]))

        async def small():
            await asyncio.sleep(0.05)  # the tokenize has started
            r = await c.get("/health")
            order.append(("health", r.status_code))
        await asyncio.gather(big(), small())
        r = await c.post("/detokenize", json={"tokens": [72, 105]})
        return order, r.json()
    order, detok = run(body)
    assert order[0] == ("health", 200) and order[1][:2] == ("tokenize", 200) and order[1][2] > 40_000
    assert detok == {"content": "Hi"}


def test_timings_per_token_puts_timings_on_the_last_chunks_of_a_chat_stream():
    """llama-server's `timings_per_token` (its test_chat_completion_with_timings_per_token):
    the role chunk has none; the choice's last chunk and the usage chunk carry `timings`.
    Without the flag no chunk does."""
    import json

    async def body(h):
        out = {}
        for flag in (True, False):
            r = await h.client.post("/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True},
                "timings_per_token": flag, "messages": [{"role": "user", "content": "hi"}]})
            out[flag] = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
        return out
    r = run(body)
    events = r[True]
    assert "timings" not in events[0] and events[0]["choices"][0]["delta"]["role"] == "assistant"
    # the role chunk's content is null, as llama-server's: no content delta is ever empty
    assert events[0]["choices"][0]["delta"]["content"] is None
    deltas = [e["choices"][0]["delta"] for e in events[1:] if e["choices"]]
    assert all(d.get("content") is None or d["content"] for d in deltas) and any(d.get("content") for d in deltas)
    usage = [e for e in events if not e["choices"]]
    assert len(usage) == 1 and usage[0]["timings"]["predicted_n"] == 3
    assert {"prompt_per_second", "predicted_per_second", "prompt_n", "cache_n"} <= set(usage[0]["timings"])
    assert "timings" in [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]][0]
    assert not any("timings" in e for e in r[False])


def test_post_sampling_probs_gives_the_probabilities_the_token_was_drawn_from():
    async def body(h):
        out = {}
        for post in (True, False):
            r = await h.client.post("/completion", json={"model": MODEL, "prompt": "hi", "n_predict": 2, "n_probs": 3,
                                                         "temperature": 1.0, "post_sampling_probs": post})
            out[post] = r.json()["completion_probabilities"]
        return out
    out = run(body)
    for tok in out[True]:
        assert 0.0 < tok["prob"] <= 1.0 and "logprob" not in tok, tok
        assert tok["top_probs"] and all(0.0 < p["prob"] <= 1.0 for p in tok["top_probs"]), tok
        assert sum(p["prob"] for p in tok["top_probs"]) <= 1.0 + 1e-6
    assert all("logprob" in t and "top_logprobs" in t for t in out[False])


def test_return_progress_streams_prompt_progress_before_the_first_token():
    """llama-server's return_progress, on chat completions and /completion: reports while the
    prompt prefills, the first where it starts (its cached part), the last with all of it."""
    long = "This is a test. " * 20

    async def reports(h, path: str, body: dict) -> tuple[list[dict], int]:
        seen, first_text = [], -1
        async with h.client.stream("POST", path, json={"model": MODEL, "stream": True, "return_progress": True,
                                                       **body}) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                d = json.loads(line[6:])
                if "prompt_progress" in d:
                    seen.append(d["prompt_progress"])
                elif first_text < 0 and ((d.get("choices") or [{}])[0].get("delta", {}).get("content")
                                         or d.get("content")):
                    first_text = len(seen)
        return seen, first_text

    async def body(h):
        chat = {"messages": [{"role": "user", "content": long}], "max_tokens": 3}
        return (await reports(h, "/v1/chat/completions", chat), await reports(h, "/v1/chat/completions", chat),
                await reports(h, "/completion", {"prompt": long, "n_predict": 2}))
    for (seen, first_text), warm in zip(run(body), (False, True, False), strict=True):
        assert len(seen) >= 2 and first_text == len(seen), seen  # all of them before the answer
        assert seen[0]["processed"] == seen[0]["cache"] and (seen[0]["cache"] > 0) == warm, seen
        assert seen[-1]["processed"] == seen[-1]["total"] > 100, seen
        pairs = zip(seen, seen[1:], strict=False)
        assert all(a["processed"] <= b["processed"] and a["total"] == b["total"] for a, b in pairs)
        assert all(p["time_ms"] >= 0 for p in seen)


def test_responses_telemetry_progress_and_timings():
    """llama-server's Responses extras: return_progress gives response.in_progress events with
    prompt_progress, timings_per_token puts timings on the text deltas and the last event."""
    async def body(h):
        events = []
        async with h.client.stream("POST", "/v1/responses", json={
                "model": MODEL, "input": "This is a test. " * 20, "max_output_tokens": 3, "stream": True,
                "return_progress": True, "timings_per_token": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
        return events
    events = run(body)
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("prompt_per_second" in e["timings"] and "predicted_per_second" in e["timings"]
                          for e in deltas)
    (done,) = [e for e in events if e["type"] in ("response.completed", "response.incomplete")]
    assert "timings" in done and "usage" in done["response"]


def test_input_tokens_responses_without_v1_and_two_final_assistant_messages():
    msgs = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]

    async def body(h):
        c = h.client
        counted = [await c.post(p, json={"model": MODEL, "messages": msgs})
                   for p in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens")]
        used = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 1})
        resp = await c.post("/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2})
        two = await c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, "messages": [
            {"role": "user", "content": "test"}, {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "b"}]})
        return counted, used, resp, two
    counted, used, resp, two = run(body)
    want = used.json()["usage"]["prompt_tokens"]
    assert [r.json() for r in counted] == [{"object": "response.input_tokens", "input_tokens": want}] * 2
    assert resp.status_code == 200 and resp.json()["object"] == "response"
    assert two.status_code == 400 and two.json()["error"]["param"] == "messages"


def test_verbose_adds_the_rendered_prompt_and_its_stats_only_when_asked():
    """llama-server's `verbose` on a chat completion (its test_verbose_debug): `__verbose`
    holds the prompt as the template rendered it, with the generation's counts."""
    async def body(h):
        return [(await h.client.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 2, "verbose": flag,
            "messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
        })).json() for flag in (True, False)]
    on, off = run(body)
    v = on["__verbose"]
    assert "Book" in v["prompt"] and "What is the best book" in v["prompt"]
    assert v["tokens_predicted"] == 2 and v["tokens_evaluated"] == on["usage"]["prompt_tokens"]
    assert v["content"] == on["choices"][0]["message"]["content"] and "predicted_per_second" in v["timings"]
    assert "__verbose" not in off
