"""Tool use and structured outputs on the Anthropic, Ollama and Responses APIs, driven by
their official clients; streamed event sequences are checked against golden fixtures under
tests/fixtures (event types only: ids, timestamps and text vary)."""

import json
from pathlib import Path

import anthropic
import httpx
import jsonschema
import ollama
import openai
import pytest

from superfluid.client import iter_sse

from .conftest import MODEL

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"],
        "additionalProperties": False}


def golden(name: str) -> list[str]:
    return json.loads((FIXTURES / name).read_text())


def runs(kinds: list[str]) -> tuple[list[str], int]:
    """The kinds with repeats in a row collapsed (a call's arguments stream as several
    deltas), and the longest run."""
    out: list[str] = []
    longest = run = 0
    for k in kinds:
        run = run + 1 if out and out[-1] == k else 1
        longest = max(longest, run)
        if run == 1:
            out.append(k)
    return out, longest


@pytest.fixture(scope="module")
def ac(daemon):
    return anthropic.Anthropic(base_url=daemon.url, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def oc(daemon):
    return ollama.Client(host=daemon.url)


# -- Anthropic ------------------------------------------------------------------------------
A_TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}]
A_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_anthropic_forced_tool_use(ac):
    m = ac.messages.create(model=MODEL, max_tokens=80, messages=A_ASK, tools=A_TOOLS,
                           tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use"
    (block,) = [b for b in m.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, CITY)


def test_anthropic_streamed_tool_use_matches_and_follows_the_grammar(daemon, ac):
    kw = dict(model=MODEL, max_tokens=80, messages=A_ASK, tools=A_TOOLS,
              tool_choice={"type": "tool", "name": "get_weather"})
    whole = ac.messages.create(**kw, extra_body={"temperature": 0})
    with ac.messages.stream(**kw, extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert [b.model_dump() for b in final.content] == [{**b.model_dump(), "id": final.content[i].id}
                                                       for i, b in enumerate(whole.content)]
    assert final.stop_reason == "tool_use"
    body = {**kw, "stream": True, "temperature": 0}
    with httpx.stream("POST", daemon.url + "/v1/messages", json=body, timeout=60) as r:
        kinds = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    shape, fragments = runs(kinds)
    assert shape == golden("anthropic_tool_stream.json") and fragments >= 2  # the input streams as it is written


def test_anthropic_tool_result_round_trip(ac):
    m = ac.messages.create(model=MODEL, max_tokens=80, messages=A_ASK, tools=A_TOOLS, tool_choice={"type": "any"},
                           extra_body={"temperature": 0})
    use = next(b for b in m.content if b.type == "tool_use")
    msgs = A_ASK + [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                                                      use.model_dump()]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                  "content": [{"type": "text", "text": "18 C, clear"}]}]}]
    out = ac.messages.create(model=MODEL, max_tokens=30, messages=msgs, tools=A_TOOLS,
                             extra_body={"temperature": 0})
    assert out.stop_reason in ("end_turn", "max_tokens", "tool_use")
    text = "".join(b.text for b in out.content if b.type == "text")
    assert "<tool_call>" not in text and "<tool_response>" not in text
    n = ac.messages.count_tokens(model=MODEL, messages=msgs, tools=A_TOOLS)
    assert n.input_tokens > ac.messages.count_tokens(model=MODEL, messages=A_ASK).input_tokens


# -- Ollama ---------------------------------------------------------------------------------
O_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": CITY}}]


@pytest.mark.parametrize("fmt", ["json", CITY], ids=["json", "schema"])
def test_ollama_format(oc, fmt):
    for seed in range(3):
        r = oc.chat(model=MODEL, messages=[{"role": "user", "content": "Name a city, as JSON."}], format=fmt,
                    options={"temperature": 0.9, "seed": seed, "num_predict": 80})
        if r.done_reason == "stop":
            data = json.loads(r.message.content)
            assert isinstance(data, dict)
            if fmt is CITY:
                jsonschema.validate(data, CITY)
    g = oc.generate(model=MODEL, prompt="A city as JSON", format=CITY, options={"temperature": 0, "num_predict": 60})
    jsonschema.validate(json.loads(g.response), CITY)


def test_ollama_whole_tool_calls_and_round_trip(daemon, oc):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": O_TOOLS,
            "tool_choice": "required", "options": {"temperature": 0, "num_predict": 80}}
    lines = [json.loads(x) for x in httpx.post(daemon.url + "/api/chat", json=body, timeout=60).text.splitlines()]
    calls = [c for ln in lines for c in ln["message"].get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    jsonschema.validate(calls[0]["function"]["arguments"], CITY)  # whole calls, arguments as an object
    assert all("<tool_call>" not in ln["message"]["content"] for ln in lines)
    msgs = body["messages"] + [{"role": "assistant", "content": "", "tool_calls": calls},
                               {"role": "tool", "content": "21 C, sunny", "tool_name": "get_weather"}]
    r = oc.chat(model=MODEL, messages=msgs, tools=O_TOOLS, options={"temperature": 0, "num_predict": 30}, think=False)
    assert r.message.role == "assistant" and (r.message.content or r.message.tool_calls)


def test_ollama_bad_format_is_400(daemon):
    r = httpx.post(daemon.url + "/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                    "format": "yaml"}, timeout=30)
    assert r.status_code == 400 and "format" in r.json()["error"]


# -- Responses ------------------------------------------------------------------------------
R_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": CITY}]


def test_responses_function_call_round_trip(client):
    r = client.responses.create(model=MODEL, input="What is the weather in Oslo?", tools=R_TOOLS,
                                tool_choice="required", temperature=0, max_output_tokens=80)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), CITY)
    nxt = client.responses.create(model=MODEL, previous_response_id=r.id, tools=R_TOOLS, temperature=0,
                                  max_output_tokens=30,
                                  input=[{"type": "function_call_output", "call_id": call.call_id,
                                          "output": "5 C, snow"}])
    assert nxt.status in ("completed", "incomplete")
    assert any(o.type in ("message", "function_call") for o in nxt.output)
    assert nxt.usage.input_tokens_details.cached_tokens > 0  # the chain's prefix was still warm
    items = client.responses.input_items.list(nxt.id)
    assert [i.type for i in items.data] == ["function_call_output"]


def test_responses_streamed_function_call(daemon, client):
    kw = dict(model=MODEL, input="Weather in Lima?", tools=R_TOOLS, tool_choice="required", temperature=0,
              max_output_tokens=80)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    shape, fragments = runs(kinds)
    assert shape == golden("responses_tool_stream.json") and fragments >= 2  # the arguments stream
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == next(o for o in whole.output if o.type == "function_call").arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_text_format_json_schema(client):
    r = client.responses.create(model=MODEL, input="A city as JSON.", temperature=0, max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "city", "schema": CITY}})
    jsonschema.validate(json.loads(r.output_text), CITY)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="x", text={"format": {"type": "json_schema", "name": "x",
                                                                         "schema": {"type": "nope"}}})


def test_openai_streamed_tool_call_wire_shape(daemon):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Kyiv?"}], "stream": True,
            "tools": O_TOOLS, "tool_choice": "required", "temperature": 0, "max_tokens": 80}
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=60) as r:
        chunks = [d for _, d in iter_sse(r.iter_lines()) if isinstance(d, dict)]
    shape = []
    for c in chunks:
        d = c["choices"][0]["delta"]
        shape.append("+".join(sorted(k for k in d if d[k] not in (None, ""))) or
                     ("finish:" + str(c["choices"][0]["finish_reason"])))
    collapsed, fragments = runs(shape)
    assert collapsed == ["role", "tool_calls", "finish:tool_calls"] == runs(golden("openai_tool_stream.json"))[0]
    assert fragments >= 3  # the call's head, then its arguments in fragments as they are written
