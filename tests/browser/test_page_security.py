"""Model output is rendered inert: script, event handlers, javascript: links and remote
images do nothing (no dialog, no script run, no request) unless the person clicks an
image; the pages carry a strict Content-Security-Policy and refuse foreign Hosts."""

import http.server
import threading

import httpx
import pytest

from superfluid.client import Client

from .chatpage import ChatPage
from .conftest import until

PAYLOAD = """Some **bold** text and code:

```python
print("hello")
```

<img src=x onerror="window.__pwned = 1; alert(1)">

<script>window.__pwned = 2; alert(2)</script>

Inline <a href="javascript:alert(3)" onclick="window.__pwned = 3">raw link</a> in a paragraph.

A [md link](javascript:window.__pwned=4) and a [safe link](https://example.com/page).

<iframe src="{remote}/frame"></iframe>

![tracker]({remote}/pixel.png)
"""


@pytest.fixture(scope="module")
def remote():
    """A web server standing for a remote host: it counts the requests it gets."""
    hits: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", hits
    srv.shutdown()


def test_model_output_is_inert(page, context, d, remote):
    base, hits = remote
    with Client(d.url) as c:
        sid = c.create(title="XSS probe")["id"]
        c.append(sid, "user", "Show me something dangerous.")
        c.append(sid, "assistant", PAYLOAD.format(remote=base))
    ChatPage(page, d.url).open(sid)
    msg = page.locator("article.msg.assistant .content")
    msg.locator("pre code.hljs").wait_for()  # rendered, code highlighted
    assert page.locator("#messages pre code .hljs-built_in, #messages pre code .hljs-string").count() >= 1
    for sel in ("script", "img", "iframe", "[onerror]", "[onclick]", "a[href^='javascript']"):
        assert page.locator(f"#messages {sel}").count() == 0, sel
    text = msg.inner_text()
    assert "<script>" in text and "onerror" in text  # raw HTML is shown as text
    safe = page.locator("#messages a", has_text="safe link")
    assert safe.get_attribute("href") == "https://example.com/page" and safe.get_attribute("target") == "_blank"
    assert "noopener" in safe.get_attribute("rel")
    assert page.locator("#messages a", has_text="raw link").count() == 0  # shown as text, not a link
    md_link = page.locator("#messages a", has_text="md link")
    assert md_link.get_attribute("href") is None
    md_link.click()
    assert page.evaluate("window.__pwned") is None
    assert hits == [] and not [u for u, _ in page.watch.requests if u.startswith(base)]
    with context.expect_page() as popup:  # the image loads only when clicked, in a tab of its own
        page.locator("#messages button.img-ph").click()
    popup.value.wait_for_load_state()
    until(lambda: "/pixel.png" in hits, what="the clicked image's request")
    assert page.watch.dialogs == []


def test_pages_carry_a_strict_csp_and_check_the_host(d):
    for path in ("/", "/monitor", "/ui/js/chat.js"):
        r = httpx.get(d.url + path, headers={"accept": "text/html"})
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe" not in csp and "frame-ancestors 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    etag = httpx.get(d.url + "/ui/app.css").headers["etag"]
    assert httpx.get(d.url + "/ui/app.css", headers={"if-none-match": etag}).status_code == 304
    assert httpx.get(d.url + "/", headers={"accept": "text/html", "host": "evil.example"}).status_code == 403
    assert httpx.get(d.url + "/v1/monitor", headers={"origin": "http://evil.example"}).status_code == 403
    assert httpx.post(d.url + "/ui/app.css").status_code == 405
    assert httpx.get(d.url + "/ui/../pyproject.toml").status_code == 404
    assert httpx.get(d.url + "/").text == "Ollama is running"  # Ollama's clients probe / without asking for HTML
