"""With --api-key the page asks for the key, keeps it in the tab's sessionStorage, sends
it as a header (never in a URL) and works; --no-ui serves no pages."""

import httpx
import pytest

from .chatpage import ChatPage
from .conftest import start_daemon

KEY = "sk-browser-test-key"


@pytest.fixture(scope="module")
def keyed():
    d = start_daemon("--api-key", KEY, max_context=512, max_batch=2)
    yield d
    d.stop()


def give_key(page, key: str) -> None:
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key-input", key)
    page.press("#key-input", "Enter")


def test_the_page_asks_for_the_key_and_works_with_it(page, keyed):
    page.goto(keyed.url + "/")  # the page itself needs no key
    give_key(page, "sk-wrong")
    page.wait_for_selector("#key-dialog[open]")
    assert "not accepted" in page.inner_text("#key-dialog .key-note")
    give_key(page, KEY)
    page.wait_for_selector("#model option", state="attached")
    page.wait_for_selector("body[data-ready='1']")
    assert page.is_hidden("#key-dialog")
    chat = ChatPage(page, keyed.url)
    chat.settings(temperature=0, max_tokens=6)
    chat.send("Say hello.")
    assert chat.answers()[-1].strip()
    sid = chat.sid()
    assert httpx.get(f"{keyed.url}/v1/sessions/{sid}", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    assert page.evaluate("sessionStorage.getItem('superfluid.key')") == KEY
    assert KEY not in page.evaluate("JSON.stringify(localStorage)")
    api = [(u, h) for u, h in page.watch.requests if "/v1/" in u]
    assert api and all(KEY not in u for u, _ in page.watch.requests)
    assert any(h.get("authorization") == f"Bearer {KEY}" for _, h in api)
    page.goto(keyed.url + "/monitor")  # the same tab: no second prompt
    page.wait_for_selector("body[data-ready='1']")
    assert page.is_hidden("#key-dialog")
    assert httpx.get(keyed.url + "/v1/monitor").status_code == 401


def test_no_ui_serves_no_pages():
    d = start_daemon("--no-ui", max_context=512, max_batch=2)
    try:
        html = {"accept": "text/html"}
        assert httpx.get(d.url + "/", headers=html).text == "Ollama is running"
        for path in ("/monitor", "/ui/app.css", "/ui/js/chat.js", "/v1/monitor"):
            assert httpx.get(d.url + path, headers=html).status_code == 404, path
    finally:
        d.stop()
