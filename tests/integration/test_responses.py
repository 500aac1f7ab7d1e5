"""The OpenAI Responses API through the official `openai` client."""

import httpx
import openai
import pytest

from .conftest import MODEL
from .daemon import Daemon


def test_create_retrieve_input_items_delete(client):
    r = client.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.",
                                max_output_tokens=8, temperature=0)
    assert r.id.startswith("resp_") and r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.input_tokens > 5 and 1 <= r.usage.output_tokens <= 8
    got = client.responses.retrieve(r.id)
    assert got.output_text == r.output_text
    items = client.responses.input_items.list(r.id)
    assert [i.role for i in items.data] == ["user"]
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=6, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0)
    alone = client.responses.create(model=MODEL, input="What is my name?", max_output_tokens=6, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens + 5  # the earlier turns reached the model


def test_stream_event_sequence(client):
    kw = dict(model=MODEL, input="Name a fruit.", max_output_tokens=6, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text


def test_store_false_and_unsupported(daemon, client):
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError, match="provider's side"):  # a hosted tool is left out, unless forced
        client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}],
                                tool_choice={"type": "web_search"})
    assert httpx.get(daemon.url + "/v1/responses/resp_nothere").status_code == 404
    assert httpx.get(daemon.url + "/v1/responses/../etc").status_code == 404


def test_stored_responses_survive_a_restart():
    d = Daemon(max_batch=1, max_context=256)
    c = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0)
    r = c.responses.create(model=MODEL, input="Remember this.", max_output_tokens=4, temperature=0)
    d.stop()
    d2 = Daemon(max_batch=1, max_context=256, home=d.home)
    try:
        c2 = openai.OpenAI(base_url=d2.url + "/v1", api_key="x", max_retries=0)
        assert c2.responses.retrieve(r.id).output_text == r.output_text
        nxt = c2.responses.create(model=MODEL, input="And now?", previous_response_id=r.id, max_output_tokens=2)
        assert nxt.status in ("completed", "incomplete")
    finally:
        d2.stop()


def test_store_false_leaves_no_conversation_in_the_log(daemon):
    """store: false: once the generation ends, the session's events are gone from the store
    file itself (not just hidden), and its id reads as not found."""
    import sqlite3
    import time
    from pathlib import Path

    secret = "my passphrase is swordfish"
    with httpx.stream("POST", daemon.url + "/v1/responses", timeout=60, json={
            "model": MODEL, "input": secret, "max_output_tokens": 4, "store": False, "stream": True}) as r:
        sid = r.headers["x-superfluid-session"]
        assert r.read()
    db = Path(daemon.home) / "sessions" / "sessions.db"
    deadline = time.monotonic() + 10
    while True:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            left = con.execute("SELECT count(*) FROM events WHERE session=?", (sid,)).fetchone()[0]
        finally:
            con.close()
        if left == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert left == 0
    assert httpx.get(f"{daemon.url}/v1/sessions/{sid}/events", timeout=10).status_code == 404
    assert sid not in [s["id"] for s in httpx.get(daemon.url + "/v1/sessions", timeout=10).json()["data"]]
