"""The reasoning channel end to end: SmolLM2 served with a chat template whose assistant
opener starts a <think> block (--chat-template-file), so what the model writes is reasoning
until it closes it; every API must carry it in its own reasoning shape, never as content."""

import json

import anthropic
import httpx
import openai
import pytest

from .conftest import MODEL
from .daemon import Daemon

THINK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}")
ASK = [{"role": "user", "content": "What is 12 times 7?"}]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "think.jinja"
    path.write_text(THINK_TEMPLATE)
    dm = Daemon("--chat-template-file", str(path), max_batch=2)
    yield dm
    dm.stop()


def test_openai_reasoning_content(d):
    c = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0)
    msg = r.choices[0].message.model_dump()
    assert msg["reasoning_content"] and "<think>" not in msg["reasoning_content"]
    streamed, content = "", ""
    for ch in c.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, temperature=0, stream=True):
        if ch.choices:
            delta = ch.choices[0].delta.model_dump()
            streamed += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
    assert streamed == msg["reasoning_content"]
    assert content == (msg["content"] or "")


def test_anthropic_thinking_blocks(d):
    ac = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
    m = ac.messages.create(model=MODEL, max_tokens=12, messages=ASK, extra_body={"temperature": 0},
                           thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.content[0].type == "thinking" and m.content[0].thinking
    with ac.messages.stream(model=MODEL, max_tokens=12, messages=ASK, extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == m.content[0].thinking


def test_ollama_thinking_and_responses_reasoning_items(d):
    r = httpx.post(d.url + "/api/chat", json={"model": MODEL, "messages": ASK, "stream": False, "think": True,
                                              "options": {"temperature": 0, "num_predict": 12}}, timeout=60).json()
    assert r["message"]["thinking"] and "<think>" not in r["message"]["content"]
    c = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0)
    resp = c.responses.create(model=MODEL, input="What is 12 times 7?", max_output_tokens=12, temperature=0)
    kinds = [o.type for o in resp.output]
    assert kinds[0] == "reasoning"
    assert json.dumps(resp.output[0].model_dump()).count("reasoning_text") == 1
    events = [e.type for e in c.responses.create(model=MODEL, input="What is 12 times 7?", max_output_tokens=12,
                                                 temperature=0, stream=True)]
    assert "response.reasoning_text.delta" in events and "response.output_text.delta" not in events


def test_a_reasoning_stream_resumes_with_reasoning_in_its_own_field(d):
    """Cut right after the first reasoning event with a cursor: the resumed rest still
    carries reasoning as reasoning_content, never as content with <think> markup."""
    from superfluid.client import iter_sse
    body = {"model": MODEL, "messages": ASK, "max_tokens": 24, "temperature": 0}
    whole = httpx.post(d.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    seen, cursor = "", None
    with httpx.stream("POST", d.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        sid = r.headers["x-superfluid-session"]
        for eid, data in iter_sse(r.iter_lines()):
            delta = data["choices"][0]["delta"] if isinstance(data, dict) and data["choices"] else {}
            seen += delta.get("reasoning_content") or ""
            if eid and delta.get("reasoning_content"):
                cursor = eid
                break
    assert cursor is not None
    rest_r, rest_c = "", ""
    with httpx.stream("GET", f"{d.url}/v1/sessions/{sid}/resume", headers={"Last-Event-ID": cursor}, timeout=60) as r:
        for _, data in iter_sse(r.iter_lines()):
            if isinstance(data, dict) and data["choices"]:
                rest_r += data["choices"][0]["delta"].get("reasoning_content") or ""
                rest_c += data["choices"][0]["delta"].get("content") or ""
    assert rest_r and seen + rest_r == whole["reasoning_content"]
    assert rest_c == (whole["content"] or "") and "<think>" not in rest_c + rest_r
