"""llama-server's own API on a real daemon: /completion (whole and streamed), /tokenize with
pieces, /detokenize, /apply-template, /props, /slots, /v1/messages/count_tokens, the OpenAI
routes without /v1, and model names: omitted, unknown (one model served: it answers) and
--alias."""

import json

import anthropic
import httpx
import ollama
import openai
import pytest

from .conftest import MODEL
from .daemon import Daemon

GREEDY = {"temperature": 0, "seed": 7}


@pytest.fixture(scope="module")
def d():
    dm = Daemon("--alias", "my-model", max_batch=2, max_context=512)
    yield dm
    dm.stop()


def post(d, path: str, body: dict) -> httpx.Response:
    return httpx.post(d.url + path, json=body, timeout=120)


def completion(d, **body) -> dict:
    r = post(d, "/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def llama_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    """llama-server's error shape: {"error": {"code": status, "message", "type"}}."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"], err
    if param is not None:
        assert err.get("param") == param, err
    return err


def stream(d, **body) -> list[dict]:
    with httpx.stream("POST", d.url + "/completion", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert "data: [DONE]" not in lines  # llama-server's /completion stream has none
    return [json.loads(ln[6:]) for ln in lines]


def test_completion_whole(d):
    prompt = "The capital of France is"
    b = completion(d, prompt=prompt, n_predict=6, ignore_eos=True, return_tokens=True, cache_prompt=True,
                   samplers=["top_k", "temperature"], **GREEDY)
    n_prompt = len(post(d, "/tokenize", {"content": prompt, "add_special": True}).json()["tokens"])
    assert b["stop"] is True and b["model"] == MODEL and b["content"]
    assert b["stop_type"] == "limit" and b["stopping_word"] == "" and b["truncated"] is False
    assert b["tokens_predicted"] == 6 and len(b["tokens"]) == 6 and b["tokens_evaluated"] == n_prompt
    assert b["prompt"] == prompt and b["generation_settings"]["n_predict"] == 6
    assert b["generation_settings"]["samplers"] == ["top_k", "temperature"]
    t = b["timings"]
    assert t["predicted_n"] == 6 and t["prompt_n"] + t["cache_n"] == n_prompt
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0 and t["predicted_per_second"] > 0
    assert completion(d, prompt=prompt, n_predict=6, ignore_eos=True, **GREEDY)["tokens"] == []  # not asked for


def test_completion_stream_matches_whole(d):
    kw = dict(prompt="Once upon a time", n_predict=8, **GREEDY)
    whole = completion(d, **kw)
    events = stream(d, **kw)
    pieces, last = events[:-1], events[-1]
    assert pieces and all(e["stop"] is False and "content" in e and e["tokens"] for e in pieces)
    assert "".join(e["content"] for e in pieces) == whole["content"]
    assert last["stop"] is True and last["content"] == "" and last["stop_type"] == whole["stop_type"]
    assert last["tokens_predicted"] == whole["tokens_predicted"] == sum(len(e["tokens"]) for e in pieces)
    assert last["timings"]["predicted_n"] == whole["tokens_predicted"]


def test_a_dropped_completion_stream_resumes_in_its_shape(d):
    """Hang up after the first piece; GET /v1/sessions/{id}/resume with Last-Event-ID gives the
    rest as /completion events, and the pieces join to the whole answer."""
    kw = dict(prompt="Twinkle, twinkle, little", n_predict=12, ignore_eos=True, **GREEDY)
    whole = completion(d, **kw)
    seen, last = [], None
    with httpx.stream("POST", d.url + "/completion", json={**kw, "stream": True}, timeout=120) as r:
        sid = r.headers["x-superfluid-session"]
        for line in r.iter_lines():
            if line.startswith("id: "):
                last = line[4:]
            elif line.startswith("data: "):
                seen.append(json.loads(line[6:]))
                if last:
                    break
    assert last and last.startswith(sid + ":") and not seen[-1]["stop"]
    with httpx.stream("GET", f"{d.url}/v1/sessions/{sid}/resume", headers={"Last-Event-ID": last},
                      timeout=120) as r:
        assert r.status_code == 200
        rest = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert rest[-1]["stop"] is True and rest[-1]["stop_type"] == "limit"
    assert "".join(e["content"] for e in seen + rest[:-1]) == whole["content"]


def test_completion_stop_word_and_eos(d):
    base = completion(d, prompt="1, 2, 3, 4, 5,", n_predict=10, ignore_eos=True, **GREEDY)
    text = base["content"]
    word = text.strip()[2:4] if len(text.strip()) >= 4 else text.strip()
    assert word and word in text
    cut = completion(d, prompt="1, 2, 3, 4, 5,", n_predict=10, ignore_eos=True, stop=[word], **GREEDY)
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word
    assert cut["content"] == text[:text.index(word)]
    chat = post(d, "/apply-template", {"messages": [{"role": "user", "content": "Say hi."}]}).json()["prompt"]
    done = completion(d, prompt=chat, n_predict=200, **GREEDY)
    assert done["stop_type"] == "eos" and done["tokens_predicted"] < 200


def test_prompt_as_tokens_and_mixed(d):
    ids = post(d, "/tokenize", {"content": "Hello world"}).json()["tokens"]
    b = completion(d, prompt=ids, n_predict=2, **GREEDY)
    assert b["tokens_evaluated"] == len(ids) and b["tokens_predicted"] >= 1
    mixed = completion(d, prompt=[*ids, " and"], n_predict=2, **GREEDY)
    more = post(d, "/tokenize", {"content": " and"}).json()["tokens"]
    assert mixed["tokens_evaluated"] == len(ids) + len(more)
    none = completion(d, prompt="Hi", n_predict=0)
    assert none["content"] == "" and none["tokens_predicted"] == 0 and none["stop_type"] == "limit"


def test_n_probs_json_schema_and_gbnf_grammar(d):
    b = completion(d, prompt="The sky is", n_predict=3, n_probs=2, ignore_eos=True, **GREEDY)
    probs = b["completion_probabilities"]
    assert len(probs) == 3 and all(len(p["top_logprobs"]) == 2 and p["logprob"] <= 0 for p in probs)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    b = completion(d, prompt="A JSON object with a number n:", n_predict=40, json_schema=schema, **GREEDY)
    assert isinstance(json.loads(b["content"])["n"], int)
    b = completion(d, prompt="Is the sky blue? Answer:", n_predict=10, grammar='root ::= " yes" | " no"', **GREEDY)
    assert b["content"] in (" yes", " no") and b["stop_type"] == "eos"


def test_completion_bad_input_gets_llama_errors(d):
    for body, param in [({"prompt": "x", "n_predict": "ten"}, "n_predict"), ({"prompt": ["a", "b"]}, "prompt"),
                        ({"prompt": [10 ** 9]}, "prompt"), ({"prompt": [[1], [2]]}, "prompt"),
                        ({"prompt": {"prompt_string": "x", "multimodal_data": ["AA=="]}}, "prompt"),
                        ({"prompt": "x", "temperature": "hot"}, "temperature"),
                        ({"prompt": "x", "n_probs": 21}, "n_probs"),
                        ({"prompt": "x", "grammar": "root ::= undefined"}, "grammar"),
                        ({"prompt": "x", "grammar": "root ::= " + "(" * 3000}, "grammar"),
                        ({"prompt": "x", "grammar": 5}, "grammar"), ({"prompt": "x", "stop": [1]}, "stop"),
                        ({"prompt": "x", "stop": ["s"] * 17}, "stop"), ({"prompt": "x", "samplers": "kz"}, "samplers"),
                        ({"prompt": "x", "logit_bias": [[10 ** 9, False]]}, "logit_bias"), ({"prompt": ""}, "prompt"),
                        ({"prompt": "x", "model": 5}, None)]:
        llama_error(post(d, "/completion", body), 400, param)
    err = llama_error(post(d, "/completion", {"prompt": "word " * 600}), 400)
    assert err["type"] == "exceed_context_size_error"
    r = httpx.post(d.url + "/completion", content=b"{nope", timeout=30)
    llama_error(r, 400)


def test_tokenize_with_pieces_and_detokenize(d):
    r = post(d, "/tokenize", {"content": "Hello world", "with_pieces": True}).json()
    assert all(set(t) == {"id", "piece"} for t in r["tokens"])
    assert "".join(t["piece"] for t in r["tokens"]) == "Hello world"
    ids = [t["id"] for t in r["tokens"]]
    assert post(d, "/detokenize", {"tokens": ids}).json() == {"content": "Hello world"}
    assert len(post(d, "/tokenize", {"content": "<|im_start|>"}).json()["tokens"]) == 1  # parse_special: true
    assert len(post(d, "/tokenize", {"content": "<|im_start|>", "parse_special": False}).json()["tokens"]) > 1
    llama_error(post(d, "/detokenize", {"tokens": [10 ** 9]}), 400, "tokens")


def test_apply_template(d):
    r = post(d, "/apply-template", {"messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    p = r.json()["prompt"]
    assert p.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "<|im_start|>user\nHi<|im_end|>" in p
    assert p.endswith("<|im_start|>assistant\n")
    llama_error(post(d, "/apply-template", {"messages": []}), 400, "messages")


def test_props_and_slots(d):
    p = httpx.get(d.url + "/props").json()
    assert p["total_slots"] == 2 and p["model_path"].endswith(".gguf") and "im_start" in p["chat_template"]
    s = p["default_generation_settings"]
    assert s["n_ctx"] == 512 and s["params"]["temperature"] == 0.8 and s["params"]["top_k"] == 40
    llama_error(httpx.post(d.url + "/props", json={}), 501)
    slots = httpx.get(d.url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1] and all(s["n_ctx"] == 512 and not s["is_processing"] for s in slots)
    assert httpx.get(d.url + "/slots", params={"fail_on_no_slot": 1}).status_code == 200
    llama_error(httpx.post(d.url + "/slots/0", params={"action": "save"}, json={"filename": "x"}), 501)


def test_count_tokens(d):
    ac = anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Hello there"}]
    n = ac.messages.count_tokens(model="claude-sonnet-4-5", messages=msgs).input_tokens
    r = post(d, "/v1/messages/count_tokens", {"messages": msgs})
    assert r.json() == {"input_tokens": n} and n > 3


def test_openai_routes_without_v1(d):
    """As llama-server routes them: /chat/completions and /models are OpenAI's without /v1,
    and /completions is the native completion (OpenAI's is /v1/completions only)."""
    c = openai.OpenAI(base_url=d.url, api_key="unused", max_retries=0, timeout=120)
    r = c.chat.completions.create(model="gpt-3.5-turbo", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert r.model == MODEL and r.choices[0].message.content
    t = post(d, "/completions", {"prompt": "Hello", "n_predict": 3, "temperature": 0}).json()
    assert t["model"] == MODEL and t["content"] and t["tokens_predicted"] == 3 and t["stop"] is True
    assert [m.id for m in c.models.list().data] == [MODEL]


def test_model_omitted_or_unknown_is_the_default_model(d):
    msgs = [{"role": "user", "content": "Hi"}]
    for model in (None, "gpt-3.5-turbo", "my-model", "MY-MODEL"):
        body = {"messages": msgs, "max_tokens": 2, **({"model": model} if model else {})}
        r = post(d, "/v1/chat/completions", body)
        assert r.status_code == 200 and r.json()["model"] == MODEL, (model, r.text)
    assert completion(d, prompt="Hi", n_predict=1, model="gpt-4")["model"] == MODEL
    ac = anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0)
    assert ac.messages.create(model="claude-3-5-sonnet", max_tokens=2, messages=msgs).model == MODEL
    oc = ollama.Client(host=d.url)
    assert oc.chat(model="llama3", messages=msgs, options={"num_predict": 2}).model == MODEL
    r = post(d, "/api/generate", {"prompt": "Hi", "stream": False, "options": {"num_predict": 2}})
    assert r.json()["model"] == MODEL
    r = post(d, "/v1/responses", {"input": "Hi", "max_output_tokens": 16})
    assert r.status_code == 200 and r.json()["model"] == MODEL, r.text
    # a catalogue lookup or an admin load names a real model (or an alias)
    assert httpx.get(d.url + "/v1/models/my-model").json()["id"] == MODEL
    assert httpx.get(d.url + "/v1/models/gpt-3.5-turbo").status_code == 404
    r = post(d, "/v1/models/load", {"model": "gpt-3.5-turbo"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert post(d, "/v1/chat/completions", {"model": 5, "messages": msgs}).status_code == 400
