"""Access log lines: fields, derived rates, JSON, and the middleware's status/time."""

import asyncio
import json
import logging

from superfluid.monitor.access import AccessLog, derive, line


def test_text_line_and_rates():
    rec = derive({"method": "POST", "path": "/v1/chat/completions", "status": 200, "model": "m",
                  "qos": "agent", "prompt_tokens": 110, "cached_tokens": 10, "completion_tokens": 21,
                  "ttft_s": 0.5, "total_s": 2.5, "finish": "length"})
    assert rec["prefill_tps"] == 200.0 and rec["decode_tps"] == 10.0
    s = line(rec, "text")
    assert s.startswith("POST /v1/chat/completions 200 model=m qos=agent prompt_tokens=110")
    assert "finish=length" in s and "ttft_s=0.500" in s


def test_json_line_omits_missing_fields():
    d = json.loads(line({"method": "GET", "path": "/v1/models", "status": 401, "total_s": 0.001}, "json"))
    assert d == {"method": "GET", "path": "/v1/models", "status": 401, "total_s": 0.001}


def test_middleware_logs_status_and_handler_fields(caplog):
    async def app(scope, receive, send):
        scope.setdefault("state", {}).setdefault("access", {}).update(model="m", prompt_tokens=3)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"secret prompt text"})

    async def run():
        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(m):
            pass

        await AccessLog(app, "json")({"type": "http", "method": "POST", "path": "/x"}, receive, send)
        await AccessLog(app, "json")({"type": "http", "method": "GET", "path": "/health"}, receive, send)

    with caplog.at_level(logging.INFO, logger="superfluid.access"):
        asyncio.run(run())
    assert len(caplog.records) == 1  # /health is not logged
    d = json.loads(caplog.records[0].getMessage())
    assert d["status"] == 201 and d["model"] == "m" and d["prompt_tokens"] == 3 and "total_s" in d
    assert "secret" not in caplog.text
