"""Tool calls and structured outputs on the OpenAI chat API, with the official client: a
forced call is valid JSON for the tool's schema even on a 135M model (the grammar engine
masks every other token), round trips, streamed deltas, and schemas over many seeds."""

import json

import httpx
import jsonschema
import openai
import pytest

from .conftest import MODEL, each

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_required_tool_choice_gives_a_valid_call(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                       temperature=0, max_tokens=80)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    schema = {WEATHER["function"]["name"]: WEATHER, TIME["function"]["name"]: TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema["function"]["parameters"])


def test_a_named_tool_choice_calls_that_tool(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       max_tokens=80)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME["function"]["parameters"])


def test_streamed_call_deltas_concatenate_to_the_whole_call(client):
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    args, name, finish, content = "", None, None, ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                assert tc.index == 0
                name = tc.function.name or name
                args += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    assert (name, args) == (whole.function.name, whole.function.arguments)
    assert finish == "tool_calls" and "<tool_call>" not in content and content == ""


def test_round_trip_call_result_answer(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           temperature=0, max_tokens=80).choices[0].message
    call = first.tool_calls[0]
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER], temperature=0, max_tokens=40)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length", "tool_calls")
    assert "<tool_call>" not in (ch.message.content or "") and "<tool_response>" not in (ch.message.content or "")
    assert ch.message.content or ch.message.tool_calls


def test_tool_choice_none_hides_the_tools(client):
    with_tools = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0,
                                                max_tokens=1)
    hidden = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none",
                                            temperature=0, max_tokens=16)
    plain = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=16)
    assert hidden.usage.prompt_tokens == plain.usage.prompt_tokens < with_tools.usage.prompt_tokens
    assert hidden.choices[0].message.content == plain.choices[0].message.content
    assert not hidden.choices[0].message.tool_calls


def test_a_call_cut_by_max_tokens_reports_length_and_leaks_nothing(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       temperature=0, max_tokens=6)
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    assert not ch.message.tool_calls and not ch.message.content


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


def test_json_schema_output_is_always_valid(client):
    replies = each(lambda seed: client.chat.completions.create(
        model=MODEL, temperature=1.0, seed=seed, max_tokens=120,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}), range(8))
    for r in replies:
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_object_output_is_an_object(client):
    replies = each(lambda seed: client.chat.completions.create(
        model=MODEL, temperature=0.8, seed=seed, max_tokens=80,
        messages=[{"role": "user", "content": "Give me a JSON object."}], response_format={"type": "json_object"}),
        range(4))
    for r in replies:
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_bad_schemas_and_choices_are_400(daemon):
    base = {"model": MODEL, "messages": ASK, "max_tokens": 4}
    nope = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    for extra in [{"response_format": nope},
                  {"response_format": {"type": "yaml"}},
                  {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "missing"}}},
                  {"tool_choice": "required"},
                  {"tools": [{"type": "function"}]}]:
        r = httpx.post(daemon.url + "/v1/chat/completions", json={**base, **extra}, timeout=30)
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        openai.OpenAI(base_url=daemon.url + "/v1", api_key="x").chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}})
