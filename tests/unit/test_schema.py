"""Strict request parsing: every bad body is a 400 that names the field."""

import orjson
import pytest

from superfluid.api.schema import ChatCompletionRequest, CompletionRequest, TokenizeRequest, parse
from superfluid.errors import BadRequest

MSGS = [{"role": "user", "content": "hi"}]


def chat(**fields) -> bytes:
    return orjson.dumps({"model": "m", "messages": MSGS, **fields})


def bad(cls, raw: bytes) -> BadRequest:
    with pytest.raises(BadRequest) as ei:
        parse(cls, raw)
    assert ei.value.status == 400
    return ei.value


def test_valid_chat_request():
    r = parse(ChatCompletionRequest, chat(max_tokens=5, stop=["a", "b"], temperature=0, top_logprobs=3))
    assert r.model == "m" and r.max_tokens == 5 and r.stop == ["a", "b"]
    assert r.messages[0].role == "user" and r.messages[0].content == "hi"
    assert r.temperature == 0 and r.top_logprobs == 3 and r.stream is False


def test_content_parts_and_null_content():
    r = parse(ChatCompletionRequest, orjson.dumps({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None}]}))
    assert r.messages[0].content[0].text == "a"
    assert r.messages[1].content is None


@pytest.mark.parametrize("raw", [b"{", b"", b"not json", b'{"model": "m",}', b"\xff\xfe"])
def test_malformed_json_is_a_bad_request_mentioning_json(raw):
    e = bad(ChatCompletionRequest, raw)
    assert "JSON" in e.message
    assert e.param is None


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"model"', b"3", b"null"])
def test_non_object_body_is_a_bad_request(raw):
    e = bad(ChatCompletionRequest, raw)
    assert "object" in e.message


@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),  # strict: a bool is not an int
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 17}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": [MSGS[0], {"role": 1, "content": "x"}]}, "messages.1.role"),
    ({"model": 5}, "model"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
])
def test_wrong_value_names_the_field(fields, param):
    e = bad(ChatCompletionRequest, chat(**fields))
    assert e.param == param
    assert param in e.message


def test_model_may_be_omitted_and_a_wrong_type_names_it():
    assert parse(ChatCompletionRequest, orjson.dumps({"messages": MSGS})).model is None  # the default model answers
    e = bad(ChatCompletionRequest, orjson.dumps({"model": 5, "messages": MSGS}))
    assert e.param == "model"


def test_missing_messages_names_messages():
    e = bad(ChatCompletionRequest, orjson.dumps({"model": "m"}))
    assert e.param == "messages"


def test_missing_role_names_the_nested_field():
    e = bad(ChatCompletionRequest, orjson.dumps({"model": "m", "messages": [{"content": "x"}]}))
    assert e.param == "messages.0.role"


def test_unknown_fields_are_ignored():
    r = parse(ChatCompletionRequest, chat(user="u1", parallel_tool_calls=True, foo={"bar": 1}))
    assert r.model == "m"
    assert not hasattr(r, "foo")


def test_completion_prompt_forms():
    for prompt in ["hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]]]:
        r = parse(CompletionRequest, orjson.dumps({"model": "m", "prompt": prompt}))
        assert r.prompt == prompt


def test_tokenize_request_model_is_optional():
    r = parse(TokenizeRequest, b'{"content": "x"}')
    assert r.model is None and r.content == "x"


# a union-typed field: pydantic's loc names the member it tried ('stop.str'); param must not
def test_wrong_type_for_stop_names_stop():
    assert bad(ChatCompletionRequest, chat(stop=5)).param == "stop"


def test_wrong_type_for_message_content_names_content():
    e = bad(ChatCompletionRequest, chat(messages=[{"role": "user", "content": 5}]))
    assert e.param == "messages.0.content"


def test_wrong_type_for_prompt_names_prompt():
    e = bad(CompletionRequest, orjson.dumps({"model": "m", "prompt": 5}))
    assert e.param == "prompt"
