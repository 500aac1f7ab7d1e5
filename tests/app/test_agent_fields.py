"""What Claude Code sends on /v1/messages (issue 31), through the official anthropic client in
one process (tests/harness.py): `cache_control`, a `system` message inside `messages`, a hosted
tool beside a function with a `propertyNames` schema, adaptive thinking, context_management,
output_config, the beta query and headers, and max_tokens far past the window (capped, never
refused). The real agents run in tests/integration/test_agents.py."""

import anthropic
import httpx2  # the anthropic client's HTTP library

from ..fakes import FakeModel
from ..harness import BASE, MODEL, run

SCHEMA = {"type": "object", "properties": {
    "path": {"type": "string"},
    "env": {"type": "object", "propertyNames": {"pattern": "^[A-Z_]+$"}, "additionalProperties": {"type": "string"}}},
    "required": ["path"]}


def test_messages_accepts_claude_code_fields():
    async def body(h):
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=h.app.asgi), base_url=BASE)
        c = anthropic.AsyncAnthropic(base_url=BASE, api_key="unused", max_retries=0, timeout=60,
                                     http_client=http)  # a timeout: the client wants one for 32000 tokens
        return await c.messages.create(
            model=MODEL, max_tokens=32000, stream=False,
            system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": [{"type": "text", "text": "Say hi.",
                                                    "cache_control": {"type": "ephemeral"}}]},
                      {"role": "system", "content": "Agents available: none."}],
            tools=[{"name": "Bash", "description": "Run a command.", "input_schema": SCHEMA},
                   {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
            extra_query={"beta": "true"},
            extra_headers={"anthropic-beta": "context-management-2025-06-27,effort-2025-11-24"},
            extra_body={"thinking": {"type": "adaptive"}, "metadata": {"user_id": "u"},
                        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                        "output_config": {"effort": "high"}})
    r = run(body, FakeModel(n_ctx=1024))
    # max_tokens 32000 is past the 1024-token window: the answer is capped, never refused
    assert r.stop_reason == "end_turn" and r.content[0].text == "Hello world."
    assert r.usage.input_tokens > 10 and r.usage.output_tokens >= 1
