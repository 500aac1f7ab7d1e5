"""The engine view at /monitor: a lane busy while a request runs (class, phase, tokens),
live rates, and idle again afterwards."""

import threading

import httpx

from .conftest import screenshot


def test_monitor_shows_a_busy_lane_while_a_request_runs(page, d, tmp_path):
    page.goto(d.url + "/monitor")
    page.wait_for_selector("body[data-ready='1']")
    panel = page.locator("section.panel[data-model]")
    assert panel.count() == 1 and "ready" in panel.locator("h2").inner_text()
    page.locator("tr.idle").wait_for()
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 200, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]}
    done = threading.Event()

    def run():
        with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=120,
                          headers={"x-superfluid-qos": "interactive"}) as r:
            for _ in r.iter_lines():
                pass
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    row = page.locator("table.lanes tr[data-lane]")
    row.first.wait_for()
    cells = row.first.locator("td").all_inner_texts()
    assert cells[1] == "interactive" and cells[2] in ("prefilling", "decoding")
    page.wait_for_function(
        "() => [...document.querySelectorAll('table.lanes tr[data-lane] td:nth-child(5)')]"
        ".some(td => Number(td.textContent) > 60)")  # tokens generated so far (a few seconds of chart)
    assert page.locator("[data-fig=lanes] .v").inner_text().startswith("1 /")
    page.wait_for_function("() => Number(document.querySelector('[data-fig=decode] .v').textContent) > 0")
    screenshot(page, "monitor.png", tmp_path)
    assert done.wait(120)
    t.join()
    page.locator("tr.idle").wait_for()
    assert page.locator("[data-fig=ttft] .v").inner_text() != "– / – s"
    page.wait_for_function("() => document.getElementById('log').textContent.includes('POST /v1/chat/completions 200')")
