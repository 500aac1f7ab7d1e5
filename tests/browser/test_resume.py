"""An answer survives the page and the daemon: reloading mid-answer continues it from
Last-Event-ID, and after the daemon is killed and restarted the open page continues the same
answer. Both end with exactly the text of an uncut greedy run."""

import os
import signal

import pytest

from superfluid.client import Client

from .chatpage import ChatPage, log_text
from tests.integration.proxy import Proxy

from .conftest import start_daemon

PROMPT = "Write a long story about a lighthouse keeper and a storm."
BUDGET = 120


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return str(tmp_path_factory.mktemp("resume-home"))


@pytest.fixture(scope="module")
def d(home):
    box = {"d": start_daemon(home=home, max_context=1024)}
    yield box  # a test may replace the daemon (a restart on the same port and home)
    box["d"].stop()


@pytest.fixture(scope="module")
def reference(d):
    """The uncut greedy answer, generated through the API, and its session."""
    with Client(d["d"].url) as c:
        s = c.create(temperature=0)
        c.append(s["id"], "user", PROMPT)
        out = c.generate(s["id"], max_tokens=BUDGET)
        assert out["finish"] == "length"  # longer than the budget: every cut is mid-answer
        return out["text"], s["id"]


def shown(page, url, sid) -> str:
    """The answer as the page renders it."""
    return ChatPage(page, url).open(sid).answers()[-1]


def start(page, url) -> ChatPage:
    chat = ChatPage(page, url).open()
    chat.settings(temperature=0, max_tokens=BUDGET)
    chat.send(PROMPT, wait=False)
    chat.wait_streaming(min_chars=20)
    return chat


def test_reload_mid_answer_continues_it(page, context, d, reference):
    url = d["d"].url
    chat = start(page, url)
    sid = chat.sid()
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_function("() => document.body.dataset.generating === '1'")  # picked up mid-answer
    chat.wait_done(0)
    resumed = [(u, h) for u, h in page.watch.requests if u.split("?")[0].endswith(f"/v1/sessions/{sid}/resume")]
    assert resumed and resumed[0][1]["last-event-id"].startswith(f"{sid}:")  # a header, not in the URL
    assert sid + ":" not in resumed[0][0]
    assert page.get_attribute("body", "data-mismatch") is None
    assert log_text(url, sid) == reference[0]
    final = chat.answers()[-1]
    assert final == shown(context.new_page(), url, reference[1])  # nothing missing, nothing twice


def test_daemon_killed_and_restarted_mid_answer(page, context, d, home, reference):
    old = d["d"]
    chat = start(page, old.url)
    sid = chat.sid()
    os.kill(old.proc.pid, signal.SIGKILL)
    old.proc.wait(10)
    page.wait_for_function("() => document.getElementById('conn').textContent.includes('reconnecting')")
    assert page.is_hidden("#notice")  # a quiet state, not an error
    d["d"] = start_daemon(home=home, max_context=1024, port=old.port)
    chat.wait_done(0, timeout=90_000)
    assert page.inner_text("#conn") == ""
    assert log_text(old.url, sid) == reference[0]
    assert chat.last().get_attribute("data-finish") == "length"
    assert page.get_attribute("body", "data-mismatch") is None
    assert chat.answers()[-1] == shown(context.new_page(), old.url, reference[1])



def test_connection_lost_mid_answer(page, context, d, reference):
    """The network drops every connection mid-answer (a proxy cuts them): the page resumes
    from its cursor with Last-Event-ID."""
    url = d["d"].url
    proxy = Proxy(d["d"].port)
    try:
        chat = start(page, f"http://127.0.0.1:{proxy.port}")
        sid = chat.sid()
        n = len(page.watch.requests)
        proxy.cut()
        chat.wait_done(0)
    finally:
        proxy.close()
    resumed = [h for u, h in page.watch.requests[n:] if u.split("?")[0].endswith(f"/v1/sessions/{sid}/resume")]
    assert resumed and resumed[0]["last-event-id"].startswith(f"{sid}:")
    assert log_text(url, sid) == reference[0]
    assert page.get_attribute("body", "data-mismatch") is None
    assert chat.answers()[-1] == shown(context.new_page(), url, reference[1])
