"""The chat page, as a test drives it: the same clicks and keys a person uses."""

from __future__ import annotations

import httpx

ANSWER = "article.msg.assistant"


class ChatPage:
    def __init__(self, page, url: str):
        self.page, self.url = page, url

    def open(self, sid: str | None = None) -> ChatPage:
        self.page.goto(self.url + "/" + (f"#s={sid}" if sid else ""))
        self.page.wait_for_selector("body[data-ready='1']")
        return self

    def settings(self, **values) -> None:
        """Set sampling settings (UI preferences) through the settings panel."""
        p = self.page
        if p.get_attribute("#settings-btn", "aria-expanded") != "true":
            p.click("#settings-btn")
        for k, v in values.items():
            p.fill(f"#{k}", str(v))
            p.dispatch_event(f"#{k}", "change")
        p.click("#settings-btn")

    def done_count(self) -> int:
        return int(self.page.get_attribute("body", "data-done") or 0)

    def send(self, text: str, *, wait: bool = True) -> None:
        """Type a message and press Enter; with `wait`, until the answer is finished and
        read back from the log."""
        before = self.done_count()
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")
        if wait:
            self.wait_done(before)

    def wait_done(self, before: int, timeout: float = 60_000) -> None:
        self.page.wait_for_function(f"() => Number(document.body.dataset.done || 0) > {before}", timeout=timeout)

    def wait_streaming(self, min_chars: int = 1) -> str:
        """Until the answer being generated shows at least `min_chars` characters (while it
        is still generating); returns what it showed."""
        self.page.wait_for_function(
            f"""() => document.body.dataset.generating === '1' &&
                [...document.querySelectorAll('{ANSWER}')].pop()?.querySelector('.content')
                  ?.textContent.length >= {min_chars}""")
        return self.answers()[-1]

    def answers(self) -> list[str]:
        return self.page.eval_on_selector_all(f"{ANSWER} .content", "els => els.map(e => e.innerText)")

    def last(self):
        return self.page.locator(ANSWER).last

    def sid(self) -> str:
        return self.page.evaluate("location.hash").removeprefix("#s=")

    def sidebar_titles(self) -> list[str]:
        return self.page.eval_on_selector_all("#sessions li .open .t", "els => els.map(e => e.textContent)")


def log_text(url: str, sid: str, headers: dict | None = None) -> str:
    """The content text of the session's last assistant turn, from the log."""
    evs = httpx.get(f"{url}/v1/sessions/{sid}/events", headers=headers or {}, timeout=30).json()["data"]
    start = max(i for i, e in enumerate(evs) if e["type"] == "generation_prompt")
    return "".join(e["text"] for e in evs[start:] if e["type"] == "generated")  # text is the content channel
