"""The Anthropic Messages API through the official `anthropic` client."""

import anthropic
import httpx
import pytest

from .conftest import MODEL


@pytest.fixture(scope="module")
def ac(daemon):
    return anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0)


def test_create(ac):
    r = ac.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0}, system="Be brief.",
                           messages=[{"role": "user", "content": "Say hello."}])
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL
    assert r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens")
    # input_tokens counts what was not read from the cache (Anthropic's usage): an earlier
    # test on the shared daemon may have sent the same prompt
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > 5 and 1 <= r.usage.output_tokens <= 8


def test_stream_matches_create_and_has_the_event_grammar(ac):
    kw = dict(model=MODEL, max_tokens=10, extra_body={"temperature": 0},
              messages=[{"role": "user", "content": "Name a fruit."}])
    whole = ac.messages.create(**kw)
    with ac.messages.stream(**kw) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_stop", "message_delta"} <= set(kinds)
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_stop_sequence_and_max_tokens(ac):
    base = ac.messages.create(model=MODEL, max_tokens=30, extra_body={"temperature": 0},
                              messages=[{"role": "user", "content": "Count from one to ten in words."}]).content[0].text
    at = next(i for i in range(5, len(base) - 3) if base.find(base[i:i + 3]) == i)  # first occurrence
    word = base[at:at + 3]
    r = ac.messages.create(model=MODEL, max_tokens=30, extra_body={"temperature": 0}, stop_sequences=[word],
                           messages=[{"role": "user", "content": "Count from one to ten in words."}])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == word and r.content[0].text == base[:at]
    r = ac.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Tell a story."}])
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2


def test_count_tokens(ac):
    n = ac.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hello there"}])
    r = ac.messages.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "Hello there"}])
    u = r.usage  # the prompt is split into read from cache, written to it, and the rest
    assert n.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens


def test_errors_have_the_anthropic_shape(daemon, ac):
    r = httpx.post(daemon.url + "/v1/messages", json={"model": 5, "max_tokens": 5,
                                                      "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(daemon.url + "/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="text only"):
        ac.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}])
