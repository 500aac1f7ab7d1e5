"""Browser tests: Debian's Chromium driven by Playwright, against real daemons and the
embedded model. Without a Chromium they are skipped, except in CI (CI=true), where that is
a failure: .ci/run installs it."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from unittest import mock

import pytest

from tests.integration import daemon as daemon_mod
from tests.integration.daemon import Daemon

CHROMIUM = os.environ.get("SUPERFLUID_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


def _need_browser():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "playwright is not installed (pip install -e '.[test]')"
    else:
        if os.path.exists(CHROMIUM):
            return
        reason = f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def start_daemon(*args: str, port: int | None = None, **kw) -> Daemon:
    """A real daemon; `port` pins the port (a restart must come back where the page is).
    Its output is drained by a thread (a full pipe would stall it) and kept for failures."""
    if port is None:
        d = Daemon(*args, **kw)
    else:
        with mock.patch.object(daemon_mod, "free_port", lambda: port):
            d = Daemon(*args, **kw)
    d.tail = deque(maxlen=200)
    threading.Thread(target=lambda: d.tail.extend(d.proc.stdout), daemon=True).start()
    return d


@pytest.fixture(scope="package")
def d():
    """A plain daemon the chat, page-security and monitor tests share."""
    daemon = start_daemon(max_context=1024)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="package")  # not session: Playwright's sync API runs an event loop in this
def browser():  # thread while it lives, and every later test's asyncio.run() would refuse to start
    _need_browser()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Watch:
    """What a page did that a test may assert on: dialogs, uncaught errors, CSP violations,
    requests."""

    def __init__(self, page):
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.requests: list[tuple[str, dict]] = []  # (url, headers)
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        page.on("console", self._console)
        page.on("request", lambda r: self.requests.append((r.url, r.headers)))

    def _dialog(self, d):
        self.dialogs.append(f"{d.type}: {d.message}")
        d.dismiss()

    def _console(self, m):
        if "Content Security Policy" in m.text or "Refused to" in m.text:
            self.errors.append(f"csp: {m.text}")


@pytest.fixture
def context(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    ctx.set_default_timeout(30_000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context):
    p = context.new_page()
    p.watch = Watch(p)
    yield p
    assert not p.watch.errors, p.watch.errors
    assert not p.watch.dialogs, p.watch.dialogs


def screenshot(page, name: str, tmp_path: Path) -> Path:
    """docs/img/NAME when SUPERFLUID_SCREENSHOTS=1 (to refresh the README's images),
    else under the test's tmp dir."""
    out = (SHOTS if os.environ.get("SUPERFLUID_SCREENSHOTS") == "1" else tmp_path) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    page.mouse.move(0, page.viewport_size["height"] - 1)  # no hover state in the picture
    page.screenshot(path=str(out))
    return out


def until(fn, timeout: float = 30.0, what: str = "condition"):
    """Poll `fn` (an observable state, e.g. the daemon's API) until it returns a truthy
    value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
