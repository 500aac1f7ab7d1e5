"""What a client's path can do to the access log and the metrics, in one process
(tests/harness.py): a preflight to any path, answered before any route matches, adds no
metrics series of its own; a newline or a terminal escape in a path is written escaped, in
the JSON log and the text log alike."""

import logging

from superfluid.monitor.access import line, shown

from ..harness import run

ORIGINS = ("http://localhost:3000", "http://evil.example")


def test_preflights_to_made_up_paths_add_no_series():
    async def body(h):
        for i in range(20):
            await h.client.options(f"/no/such/{i}", headers={"origin": ORIGINS[i % 2],
                                                             "access-control-request-method": "POST"})
        return (await h.client.get("/metrics")).text
    text = run(body)
    series = [ln for ln in text.splitlines() if ln.startswith("superfluid_requests_total{")]
    assert not any("/no/such" in ln for ln in series), series
    assert any('path="preflight",status="200"} 20.0' in ln for ln in series), series


def test_control_characters_in_a_path_are_escaped_in_the_log(caplog):
    async def body(h):
        await h.client.get("/a%0Ab%1B[31mred%E2%80%AE")
        return h.access[-1]
    with caplog.at_level(logging.INFO, logger="superfluid.access"):
        rec = run(body)
    assert rec["path"] == "/a\\nb\\x1b[31mred\\u202e" and rec["status"] == 404
    text = line(rec, "text")
    assert "\n" not in text and "\x1b" not in text and "\u202e" not in text
    assert all("\x1b" not in r.getMessage() and "\n" not in r.getMessage() for r in caplog.records)
    assert shown("/ok/path") == "/ok/path" and shown("/x" * 300).endswith("…")


def _labels(text: str) -> set[str]:
    return {ln.split("{", 1)[1].split('path="', 1)[1].split('"', 1)[0]
            for ln in text.splitlines() if ln.startswith("superfluid_requests_total{")}


def test_redirected_and_unknown_paths_add_no_label_values():
    """A trailing slash on a templated route is a 307 that no route matched, and its raw path
    became a label (one was 20 KB): any number of made-up paths now adds no label value."""
    async def body(h):
        async def batch(n: int, tag: str):
            for i in range(n):
                for p in (f"/v1/models/{tag}{i}{'m' * 200}/", f"/health/{'/' * (i % 2)}", f"/no/such/{tag}{i}",
                          f"/v1/chat/completions/?{tag}={i}"):
                    await h.client.get(p, follow_redirects=False)
            return _labels((await h.client.get("/metrics")).text)
        await h.client.get("/")  # the web app's page: its own file, labelled by its path
        first = await batch(1, "a")
        return first, await batch(25, "b")
    first, later = run(body)
    assert first == later, later - first
    assert {"redirect", "unmatched", "/"} <= first and all(len(v) < 40 for v in first), first
