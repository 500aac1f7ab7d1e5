"""Typed output end to end: a forced tool call streamed on the OpenAI, Anthropic and
Responses APIs, cut right after its first argument fragment and resumed with Last-Event-ID,
gives argument deltas in the API's own format that join to the uncut call, with no markup
as content; logprobs with tools never show markup."""

import json
import time

import anthropic
import httpx

from superfluid.client import iter_sse

from .conftest import MODEL

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"],
        "additionalProperties": False}
O_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": CITY}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _events(r) -> list[tuple[str | None, object]]:
    return list(iter_sse(r.iter_lines()))


def _cut_after(url: str, body: dict, first_fragment) -> tuple[str, list, str]:
    """Stream, stop reading right after the event that carries the first argument fragment
    (and a cursor), and hang up. Returns (session, data seen, last cursor)."""
    seen, last = [], None
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200
        sid = r.headers["x-superfluid-session"]
        for eid, data in iter_sse(r.iter_lines()):
            seen.append(data)
            last = eid or last
            if eid and first_fragment(data):
                break
    assert last is not None and last.startswith(sid + ":")
    return sid, seen, last


def _resume(base: str, sid: str, cursor: str) -> list:
    with httpx.stream("GET", f"{base}/v1/sessions/{sid}/resume", headers={"Last-Event-ID": cursor},
                      timeout=60) as r:
        assert r.status_code == 200
        return [data for _, data in iter_sse(r.iter_lines())]


def _chat_args(events: list) -> tuple[str, str, list[str]]:
    args, content, finish = "", "", []
    for e in events:
        if not isinstance(e, dict) or not e.get("choices"):
            continue
        ch = e["choices"][0]
        content += ch["delta"].get("content") or ""
        for tc in ch["delta"].get("tool_calls") or []:
            args += tc["function"].get("arguments") or ""
        if ch.get("finish_reason"):
            finish.append(ch["finish_reason"])
    return args, content, finish


def test_openai_tool_call_cut_after_its_first_fragment_resumes_as_deltas(daemon, client):
    kw = dict(model=MODEL, messages=ASK, tools=O_TOOLS, tool_choice="required", temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0].function.arguments

    def fragment(d):
        return isinstance(d, dict) and any(tc["function"].get("arguments") for ch in d["choices"]
                                           for tc in ch["delta"].get("tool_calls") or [])
    sid, seen, cursor = _cut_after(daemon.url + "/v1/chat/completions", {**kw, "stream": True}, fragment)
    before, _, _ = _chat_args(seen)
    rest = _resume(daemon.url, sid, cursor)
    after, content, finish = _chat_args(rest)
    assert before and after, "the arguments must come in fragments on both sides of the cut"
    assert before + after == whole and json.loads(whole)["city"]
    assert content == "" and finish == ["tool_calls"] and rest[-1] == "[DONE]"
    assert not any(isinstance(e, dict) and e.get("choices") and "role" in e["choices"][0]["delta"] for e in rest)


def test_anthropic_tool_use_cut_after_its_first_fragment_resumes_as_input_json_deltas(daemon):
    ac = anthropic.Anthropic(base_url=daemon.url, api_key="x", max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}]
    kw = dict(model=MODEL, max_tokens=80, messages=ASK, tools=tools,
              tool_choice={"type": "tool", "name": "get_weather"})
    whole = next(b for b in ac.messages.create(**kw, extra_body={"temperature": 0}).content if b.type == "tool_use")

    def fragment(d):
        return isinstance(d, dict) and d.get("type") == "content_block_delta" and \
            d["delta"].get("type") == "input_json_delta" and d["delta"]["partial_json"]
    sid, seen, cursor = _cut_after(daemon.url + "/v1/messages", {**kw, "stream": True, "temperature": 0}, fragment)
    rest = _resume(daemon.url, sid, cursor)

    def partial(evs):
        return "".join(e["delta"]["partial_json"] for e in evs if isinstance(e, dict)
                       and e.get("type") == "content_block_delta" and e["delta"].get("type") == "input_json_delta")
    assert partial(rest), "the rest of the input streams as input_json_delta"
    assert json.loads(partial(seen) + partial(rest)) == whole.input
    kinds = [e["type"] for e in rest if isinstance(e, dict)]
    assert "message_start" not in kinds and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert next(e for e in rest if isinstance(e, dict) and e.get("type") == "message_delta")["delta"][
        "stop_reason"] == "tool_use"
    assert not any(e["type"] == "content_block_delta" and e["delta"].get("type") == "text_delta"
                   for e in rest if isinstance(e, dict))


def test_responses_function_call_cut_after_its_first_fragment_resumes_as_argument_deltas(daemon, client):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": CITY}]
    kw = dict(model=MODEL, input="Weather in Lima?", tools=tools, tool_choice="required", temperature=0,
              max_output_tokens=80)
    whole = next(o for o in client.responses.create(**kw).output if o.type == "function_call").arguments

    def fragment(d):
        return isinstance(d, dict) and d.get("type") == "response.function_call_arguments.delta"
    sid, seen, cursor = _cut_after(daemon.url + "/v1/responses", {**kw, "stream": True}, fragment)
    rest = _resume(daemon.url, sid, cursor)

    def deltas(evs):
        return "".join(e["delta"] for e in evs if isinstance(e, dict)
                       and e.get("type") == "response.function_call_arguments.delta")
    assert deltas(rest) and deltas(seen) + deltas(rest) == whole
    done = next(e for e in rest if isinstance(e, dict) and e.get("type") == "response.function_call_arguments.done")
    assert done["arguments"] == whole
    seqs = [e["sequence_number"] for e in seen + rest if isinstance(e, dict)]
    assert seqs == list(range(len(seqs)))  # the resumed stream numbers on where the cut one stopped
    assert rest[-1]["type"] == "response.completed"


def test_logprobs_with_tools_show_no_markup(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=O_TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=80, logprobs=True, top_logprobs=2)
    ch = r.choices[0]
    assert ch.message.tool_calls and not ch.message.content
    assert not any("<tool_call>" in (t.token or "") or "tool_call" in (t.token or "") for t in ch.logprobs.content)
    prose = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                           tools=O_TOOLS, temperature=0, max_tokens=12, logprobs=True)
    p = prose.choices[0]
    assert p.message.content and not p.message.tool_calls
    assert "".join(t.token for t in p.logprobs.content) == p.message.content  # one per content token
    assert len(p.logprobs.content) <= prose.usage.completion_tokens


def test_a_dropped_stream_is_cut_at_once_and_a_resume_continues_it_exactly(daemon, client):
    """The client goes away: its generation stops at once (its lane is free for others) and
    the log says "dropped". A resume with Last-Event-ID continues it from the log: seen plus
    resumed is the uncut greedy text, with the uncut run's finish and usage."""
    body = {"model": MODEL, "max_tokens": 40, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}]}
    whole = httpx.post(daemon.url + "/v1/chat/completions", json=body, timeout=60).json()

    def content(d):
        return isinstance(d, dict) and d["choices"] and d["choices"][0]["delta"].get("content")
    sid, seen, cursor = _cut_after(daemon.url + "/v1/chat/completions", {**body, "stream": True}, content)
    info = {}
    for _ in range(300):  # the daemon notices the hang-up and cuts the generation
        info = httpx.get(f"{daemon.url}/v1/sessions/{sid}", timeout=10).json()
        if not info["busy"]:
            break
        time.sleep(0.05)
    assert not info["busy"] and info["turn_open"]
    log = httpx.get(f"{daemon.url}/v1/sessions/{sid}/events", timeout=10).json()["data"]
    assert log[-1]["finish"] == "dropped"
    rest = _resume(daemon.url, sid, cursor)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in seen + rest
                   if isinstance(e, dict) and e.get("choices"))
    assert text == whole["choices"][0]["message"]["content"]
    final = [e for e in rest if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]]
    assert final[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert final[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert final[-1]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]


def test_a_native_resume_with_a_huge_budget_stays_within_the_window(daemon):
    """?budget= comes from the caller: a huge one continues the cut turn only up to the
    model's window (a finish, not an error mid-stream)."""
    s = httpx.post(daemon.url + "/v1/sessions", json={"temperature": 0}).json()["id"]
    httpx.post(f"{daemon.url}/v1/sessions/{s}/messages", json={"role": "user", "content": "Count to a thousand."})
    last = None
    with httpx.stream("POST", f"{daemon.url}/v1/sessions/{s}/generate", json={"stream": True, "max_tokens": 20},
                      timeout=60) as r:
        for eid, _ in iter_sse(r.iter_lines()):
            last = eid or last
            if last:
                break
    for _ in range(200):
        if not httpx.get(f"{daemon.url}/v1/sessions/{s}").json()["busy"]:
            break
        time.sleep(0.05)
    with httpx.stream("GET", f"{daemon.url}/v1/sessions/{s}/resume?budget=1000000000",
                      headers={"Last-Event-ID": last}, timeout=300) as r:
        assert r.status_code == 200
        out = [d for _, d in iter_sse(r.iter_lines())]
    assert out[-1] == "[DONE]"
    assert [d["finish"] for d in out if isinstance(d, dict) and d.get("finish")] in (["length"], ["end_of_turn"])
