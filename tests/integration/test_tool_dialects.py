"""`superfluid serve --tool-dialect`: the embedded model served with the Harmony dialect instead
of the one detected from its ChatML template. A forced call is written in Harmony's syntax
(the grammar) and comes back as a parsed call, whole and streamed; a plain reply (no Harmony
header) is content; a tool history is accepted; an unknown name is a clear CLI error."""

import json
import subprocess
import sys

import jsonschema
import openai
import pytest

from .conftest import MODEL
from .daemon import Daemon, free_port

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client():
    d = Daemon("--tool-dialect", "harmony")
    yield openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    d.stop()


def test_a_forced_call_in_harmony_syntax_is_a_parsed_call(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       temperature=0, max_tokens=120)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_streamed_forced_call_has_no_harmony_markup_in_the_content(client):
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=120)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    content, name, args, reasoning = "", None, "", ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            reasoning += getattr(ch.delta, "reasoning_content", None) or ""
            for tc in ch.delta.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
    assert (name, args) == (whole.function.name, whole.function.arguments)
    assert content == "" and reasoning == ""


def test_a_plain_reply_without_a_harmony_header_is_content(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                       temperature=0, max_tokens=16)
    text = r.choices[0].message.content
    assert text and "<|" not in text


def test_a_tool_history_is_accepted(client):
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], temperature=0, max_tokens=16)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_an_unknown_dialect_is_a_cli_error_listing_the_names():
    r = subprocess.run([sys.executable, "-m", "superfluid.cli", "serve", "--tool-dialect", "klingon",
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "klingon" in r.stderr and "hermes" in r.stderr and "harmony" in r.stderr and "Traceback" not in r.stderr
