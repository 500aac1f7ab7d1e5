"""QoS preemption and the prefix cache on the real model."""

import asyncio
import re
import threading
import time

import httpx
import openai
import pytest

from .conftest import MODEL
from .daemon import Daemon

DOC = ("The river Ouse rises in the hills and flows past old mills, quiet farms and a market town "
       "where boats once carried wool and grain to the sea. ") * 12


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's series, or of those that have all these label values."""
    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})? ([0-9.e+-]+)$", text, re.M):
        if all(f'{k}="{v}"' in (m.group(1) or "").split(",") for k, v in labels.items()):
            total += float(m.group(2))
    return total


@pytest.fixture(scope="module")
def one_lane():
    d = Daemon("--kv-slots", "2", max_batch=1, max_context=1024)
    yield d
    d.stop()


def stream_text(url, body, headers=None, started=None, stop=None):
    """The streamed text; `started` is set at its first text, and setting `stop` hangs up."""
    text = ""
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                      headers=headers or {}, timeout=120) as r:
        for line in r.iter_lines():
            if stop is not None and stop.is_set():
                break
            if line.startswith("data: {"):
                import json
                ch = json.loads(line[6:])
                for c in ch.get("choices", []):
                    text += c["delta"].get("content") or ""
                    if text and started is not None:
                        started.set()
    return text


def test_preempted_greedy_stream_equals_its_unpreempted_text(one_lane):
    url = one_lane.url
    bg = {"model": MODEL, "max_tokens": 60, "temperature": 0, "ignore_eos": True,
          "messages": [{"role": "user", "content": "Write a story about a fox."}]}
    alone = stream_text(url, bg, {"x-superfluid-qos": "background"})
    before = metric(url, "superfluid_preemptions_total")
    started = threading.Event()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("bg", stream_text(
        url, bg, {"x-superfluid-qos": "background"}, started)))
    t.start()
    assert started.wait(60)
    chat = httpx.post(url + "/v1/chat/completions", timeout=120, headers={"x-superfluid-qos": "interactive"},
                      json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi!"}]})
    assert chat.status_code == 200
    t.join(120)
    assert metric(url, "superfluid_preemptions_total") == before + 1
    assert out["bg"] == alone  # paused, resumed, nothing repeated or lost


def test_interactive_chat_is_answered_before_the_background_job_ends(one_lane):
    url = one_lane.url
    bg = {"model": MODEL, "max_tokens": 300, "temperature": 0, "ignore_eos": True,
          "messages": [{"role": "user", "content": "Write a long story about a bear."}]}
    started, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=stream_text, args=(url, bg, {"x-superfluid-qos": "background"}, started, stop))
    t.start()
    assert started.wait(60)
    r = httpx.post(url + "/v1/chat/completions", timeout=120, headers={"x-superfluid-qos": "0"},
                   json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "Hello"}]})
    bg_running = t.is_alive()
    stop.set()  # the rest of the job proves nothing more: hang up (its lane is freed)
    t.join(120)
    assert r.status_code == 200
    assert bg_running  # the chat was answered before the background job ended


def test_a_short_chat_without_a_header_takes_the_lane_of_a_long_job_of_its_class(one_lane):
    # neither sends x-superfluid-qos: both are in the default class; the chat is short, the
    # story has far more work left, so the chat takes its lane (sched/srpt.py) and the story
    # only pauses: its greedy text is what it is alone
    url = one_lane.url
    story = {"model": MODEL, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
             "messages": [{"role": "user", "content": "Write a long story about a whale."}]}
    alone = stream_text(url, story)
    before = metric(url, "superfluid_short_preemptions_total")
    started = threading.Event()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("story", stream_text(url, story, None, started)))
    t.start()
    assert started.wait(60)
    chat = httpx.post(url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi!"}]})
    story_running = t.is_alive()
    t.join(120)
    assert chat.status_code == 200
    assert story_running  # the chat did not wait for the story's lane
    assert metric(url, "superfluid_short_preemptions_total") == before + 1
    assert out["story"] == alone


def test_cached_tokens_on_a_repeated_prefix(client):
    msgs = [{"role": "system", "content": DOC}, {"role": "user", "content": "Where does the river rise?"}]
    first = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, temperature=0)
    msgs[1]["content"] = "What did the boats carry?"
    second = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, temperature=0)
    assert first.usage.prompt_tokens > 200
    assert second.usage.prompt_tokens_details.cached_tokens > 200


def test_shared_prefix_burst_prefills_the_prefix_about_once(daemon):
    url = daemon.url
    system = DOC + " Answer in one word."
    n_sys = httpx.post(url + "/tokenize", json={"content": system}).json()["count"]
    prefill0 = metric(url, "superfluid_prefill_tokens_total")

    async def burst():
        ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
        rs = await asyncio.gather(*(ac.chat.completions.create(
            model=MODEL, max_tokens=3, temperature=0,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": f"Question {i}: what is item {i}?"}]) for i in range(32)))
        await ac.close()
        return rs

    rs = asyncio.run(burst())
    assert len(rs) == 32 and all(r.choices[0].finish_reason in ("stop", "length") for r in rs)
    prompt = max(r.usage.prompt_tokens for r in rs)
    distinct = prompt - n_sys  # template, question and a margin: at most this per request
    prefilled = metric(url, "superfluid_prefill_tokens_total") - prefill0
    assert prefilled <= 1.2 * n_sys + 32 * distinct, (prefilled, n_sys, distinct)


def test_oversubscribed_lanes_all_complete_then_a_fresh_request_is_served(daemon):
    async def many():
        ac = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key="x", max_retries=0, timeout=300)
        rs = await asyncio.gather(*(ac.chat.completions.create(
            model=MODEL, max_tokens=6, temperature=0,
            messages=[{"role": "user", "content": f"Tell me about the number {i * 7919}."}])
            for i in range(24)))
        await ac.close()
        return rs

    rs = asyncio.run(many())
    assert all(r.usage.completion_tokens >= 1 for r in rs)
    h = daemon.health()
    assert next(iter(h["models"].values()))["waiting"] == 0
    r = httpx.post(daemon.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "ok?"}]})
    assert r.status_code == 200


def test_metrics_names(daemon):
    text = httpx.get(daemon.url + "/metrics").text
    for name in ("superfluid_lanes_active", "superfluid_queue_depth", "superfluid_preemptions_total",
                 "superfluid_prefill_tokens_total", "superfluid_decode_tokens_total",
                 "superfluid_cached_tokens_total", "superfluid_cold_admissions_total",
                 "superfluid_evictions_total", "superfluid_ttft_seconds_bucket",
                 "superfluid_inter_token_seconds_bucket", "superfluid_worker_respawns_total",
                 "superfluid_kv_tokens_used", "superfluid_kv_tokens_total", "superfluid_requests_total",
                 "superfluid_errors_total"):
        assert name in text, name


def test_metrics_move_under_load(daemon):
    """Each figure moves by exactly what the requests did: 3 greedy chats of 4 tokens each
    (ignore_eos, so none ends early: the first token of each comes from its prefill, 3 from
    decode steps) and 1 request with no messages (a 400)."""
    url = daemon.url
    deadline = time.monotonic() + 60
    while (row := next(iter(daemon.health()["models"].values())))["running"] or row["waiting"]:
        assert time.monotonic() < deadline, row  # an earlier test's generation still running
        time.sleep(0.2)
    chat, bad = {"path": "/v1/chat/completions", "status": "200"}, {"path": "/v1/chat/completions", "status": "400"}
    figures = {"decode": ("superfluid_decode_tokens_total", {}), "requests": ("superfluid_requests_total", {}),
               "chats": ("superfluid_requests_total", chat),
               "bad": ("superfluid_requests_total", bad), "ttft": ("superfluid_ttft_seconds_count", {}),
               "errors": ("superfluid_errors_total", {}),
               "invalid": ("superfluid_errors_total", {"type": "invalid_request_error"})}
    before = {k: metric(url, name, **labels) for k, (name, labels) in figures.items()}
    for i in range(3):
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"count {i}"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={"model": MODEL, "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    moved = {k: metric(url, name, **labels) - before[k] for k, (name, labels) in figures.items()}
    assert moved == {"decode": 9, "requests": 4, "chats": 3, "bad": 1, "ttft": 3, "errors": 1, "invalid": 1}
    assert 0 < metric(url, "superfluid_kv_tokens_used") <= metric(url, "superfluid_kv_tokens_total")
