"""The chat page in Chromium against a real daemon: a streamed answer with usage figures,
stop, the sidebar (rename, archive, delete, search), fork and edit, trim, export, themes
and the phone layout."""

import json

import httpx
import pytest

from .chatpage import ANSWER, ChatPage, log_text
from .conftest import screenshot


@pytest.fixture
def chat(page, d):
    c = ChatPage(page, d.url).open()
    c.settings(temperature=0, max_tokens=24)
    return c


def events(d, sid):
    return httpx.get(f"{d.url}/v1/sessions/{sid}/events", timeout=30).json()["data"]


def test_send_streams_the_answer_with_usage_figures(chat, d, tmp_path):
    chat.settings(max_tokens=160)
    chat.send("Write a long story about a lighthouse keeper and a storm.", wait=False)
    before = chat.done_count()
    partial = chat.wait_streaming(min_chars=5)  # shown while still generating
    chat.wait_done(before)
    final = chat.answers()[-1]
    assert partial and len(partial) < len(final)
    sid = chat.sid()
    assert sid.startswith("sess-")
    assert final.split() == log_text(d.url, sid).split()  # what the page shows is the log's answer
    usage = chat.last().locator(".usage").inner_text()
    for figure in ("tokens", "TTFT", "tok/s", "cached"):
        assert figure in usage, usage
    n = sum(len(e["span"]) for e in events(d, sid) if e["type"] == "generated")
    assert usage.startswith(f"{n} tokens")
    assert chat.page.get_attribute("body", "data-mismatch") is None
    assert "Write a long story about a lighthouse keeper" in chat.sidebar_titles()[0]
    screenshot(chat.page, "chat.png", tmp_path)


def test_stop_mid_answer_and_continue(chat, d):
    chat.settings(max_tokens=400)
    chat.send("Write a long story about a dragon who learns to bake bread.", wait=False)
    before = chat.done_count()
    chat.wait_streaming(min_chars=10)
    chat.page.keyboard.press("Escape")  # Esc stops, like the Stop button
    chat.wait_done(before)
    assert chat.last().get_attribute("data-finish") == "cancelled"
    assert "stopped" in chat.last().locator(".state").inner_text()
    gen = [e for e in events(d, chat.sid()) if e["type"] == "generated"]
    assert gen[-1]["finish"] == "cancelled" and sum(len(e["span"]) for e in gen) < 400
    stopped = chat.answers()[-1]
    chat.settings(max_tokens=8)
    before = chat.done_count()
    chat.last().locator("[data-act=continue]").click()  # the turn stays open: continue it
    chat.wait_done(before)
    evs = events(d, chat.sid())
    assert [e["type"] for e in evs].count("generation_prompt") == 1  # the same turn, continued
    assert evs[-1]["finish"] == "length" and len(chat.answers()[-1]) > len(stopped)
    assert chat.page.locator(ANSWER).count() == 1


def test_rename_archive_search_and_delete(chat, d):
    chat.page.fill("#input", "Name one")
    chat.page.press("#input", "Shift+Enter")  # a new line, not a send
    chat.page.type("#input", "planet.")
    assert chat.page.input_value("#input") == "Name one\nplanet." and chat.done_count() == 0
    chat.send("Name one planet.")
    sid = chat.sid()
    item = chat.page.locator(f"#sessions li[data-sid='{sid}']")
    chat.page.click("#new-chat")
    assert chat.page.locator("article.msg").count() == 0
    item.locator(".open").click()  # open a past conversation from the list
    chat.page.wait_for_function(f"() => location.hash === '#s={sid}'")
    chat.page.locator("article.msg.assistant").wait_for()
    item.locator("[data-act=rename]").click()
    chat.page.fill("#sessions input.rename", "Planets talk")
    chat.page.press("#sessions input.rename", "Enter")
    item.locator(".open .t", has_text="Planets talk").wait_for()
    assert httpx.get(f"{d.url}/v1/sessions/{sid}").json()["title"] == "Planets talk"
    assert chat.page.inner_text("#title") == "Planets talk"
    chat.page.fill("#search", "planets TALK")
    assert chat.sidebar_titles() == ["Planets talk"]
    chat.page.fill("#search", "")
    item.locator("[data-act=archive]").click()
    item.wait_for(state="detached")
    assert httpx.get(f"{d.url}/v1/sessions/{sid}").json()["archived"] is True
    chat.page.check("#show-archived")
    item.locator("[data-act=archive]").click()  # back from the archive
    item.wait_for(state="detached")
    chat.page.uncheck("#show-archived")
    item.locator("[data-act=delete]").click()
    assert httpx.get(f"{d.url}/v1/sessions/{sid}").status_code == 200  # the first click only asks
    item.locator("[data-act=delete]").click()
    item.wait_for(state="detached")
    assert httpx.get(f"{d.url}/v1/sessions/{sid}").status_code == 404
    assert chat.page.inner_text("#title") == "New chat"


def test_fork_from_the_second_message_keeps_the_parent(chat, d):
    chat.send("Name a color.")
    chat.send("Name a fruit.")
    parent = chat.sid()
    parent_events = events(d, parent)
    msgs = chat.page.locator("article.msg")
    assert msgs.count() == 4
    msgs.nth(1).locator("[data-act=fork]").click()  # the first answer
    chat.page.wait_for_function(f"() => location.hash !== '#s={parent}'")
    child = chat.sid()
    chat.page.locator("article.msg").nth(1).wait_for()
    assert chat.page.locator("article.msg").count() == 2
    chat.send("Name an animal.")
    assert chat.page.locator("article.msg").count() == 4
    titles = chat.sidebar_titles()
    assert "Name a color." in titles and "Name a color. (fork)" in titles
    assert events(d, parent) == parent_events  # the parent is intact
    second_user = [e["id"] for e in parent_events if e["type"] == "message" and e["role"] == "user"][1]
    info = httpx.get(f"{d.url}/v1/sessions/{child}").json()
    assert info["parent"] == parent and info["fork_at"] == second_user - 1  # right after the first answer
    # edit the first message: a fork before it, with the text in the composer
    chat.open(parent)
    chat.page.locator("article.msg").first.locator("[data-act=edit]").click()
    chat.page.wait_for_function(f"() => location.hash !== '#s={parent}' && location.hash !== '#s={child}'")
    assert chat.page.input_value("#input") == "Name a color."
    assert chat.page.locator("article.msg").count() == 0
    chat.send("Name a shape.")
    assert chat.page.eval_on_selector_all("article.msg.user .content",
                                          "els => els.map(e => e.innerText)") == ["Name a shape."]
    assert chat.sidebar_titles().count("Name a color. (fork)") == 2
    assert events(d, parent) == parent_events


def test_trim_and_export(chat, d, tmp_path):
    chat.send("Say one word.")
    chat.send("Say another word.")
    sid = chat.sid()
    total = len(events(d, sid))
    chat.page.locator(ANSWER).first.locator("[data-act=trim]").click()
    chat.page.wait_for_function("() => document.querySelectorAll('article.msg').length === 2")
    assert httpx.get(f"{d.url}/v1/sessions/{sid}").json()["events"] == total + 1  # the log keeps all, plus the trim
    with chat.page.expect_download() as dl:
        chat.page.click("#export-json")
    data = json.loads(dl.value.path().read_text())
    assert data["session"]["id"] == sid and len(data["events"]) == total + 1
    assert data["events"][-1]["type"] == "trim"
    with chat.page.expect_download() as dl:
        chat.page.click("#export-md")
    md = dl.value.path().read_text()
    assert "## User" in md and "Say one word." in md and "Say another word." not in md


def test_theme_and_phone_layout(context, d, tmp_path):
    page = context.new_page()
    c = ChatPage(page, d.url).open()
    page.click("#theme")  # auto -> light -> dark
    page.click("#theme")
    assert page.get_attribute("html", "data-theme") == "dark"
    page.set_viewport_size({"width": 390, "height": 800})
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")  # off-canvas
    page.click("#open-side")
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    page.click("#close-side")
    assert page.get_attribute("#input", "placeholder").startswith("Message")
    assert page.locator("label[for=input]").count() == 1  # labelled for screen readers
    c.open()
    assert page.get_attribute("html", "data-theme") == "dark"  # a preference: kept across loads


def test_tool_calls_show_as_cards(page, d):
    s = httpx.post(f"{d.url}/v1/sessions", json={"title": "Tools"}).json()["id"]
    httpx.post(f"{d.url}/v1/sessions/{s}/messages", json={"role": "user", "content": "Weather in Paris?"})
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    r = httpx.post(f"{d.url}/v1/sessions/{s}/messages", json={"role": "assistant", "content": "", "tool_calls": [call]})
    assert r.status_code == 200, r.text
    httpx.post(f"{d.url}/v1/sessions/{s}/tool_results", json={"call_id": "call_1", "content": "18 C, clear"})
    ChatPage(page, d.url).open(s)
    card = page.locator("article.msg.assistant .tool-card")
    card.wait_for()
    assert "get_weather" in card.inner_text() and '"city": "Paris"' in card.inner_text()
    assert page.locator("article.msg.tool .content").inner_text() == "18 C, clear"


def test_a_tool_call_the_model_made_shows_as_a_card(page, d):
    """A forced call made through the OpenAI API is in the log as typed output (a call, not
    markup): the page shows it as a card and shows no <tool_call> text."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
    r = httpx.post(f"{d.url}/v1/chat/completions", timeout=60, json={
        "model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [tool], "tool_choice": "required",
        "temperature": 0, "max_tokens": 60})
    sid = r.headers["x-superfluid-session"]
    (call,) = r.json()["choices"][0]["message"]["tool_calls"]
    ChatPage(page, d.url).open(sid)
    card = page.locator("article.msg.assistant .tool-card")
    card.wait_for()
    city = json.loads(call["function"]["arguments"])["city"]
    assert "get_weather" in card.inner_text() and city in card.inner_text()
    assert "<tool_call>" not in page.locator("article.msg.assistant .content").inner_text()
