"""A short chat while another client sends the largest request the limits accept (4,096
messages, 128 tools, 16 stop strings of 256 characters): the chat's time to first token
against an idle daemon's. Rendering and tokenizing run off the event loop, so the chat
should barely notice.

    python bench/large_request.py [--rounds 3]

Target (issue 14): chat TTFT <= idle TTFT + 2 s."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
from common import Daemon, stream_ttft

MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "Hi there!"}]}


def largest() -> dict:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "x" * 100, "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(8)}}}} for i in range(128)]
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * 20}
            for i in range(4096)]
    return {"model": MODEL, "messages": msgs, "tools": tools, "max_tokens": 4,
            "stop": ["s" * 255 + str(i) for i in range(16)]}


async def one_round(url: str, big: dict) -> tuple[float, float, int]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        idle, _ = await stream_ttft(c, CHAT)
        t0 = time.perf_counter()
        task = asyncio.create_task(c.post("/v1/chat/completions", json=big))
        await asyncio.sleep(0.3)  # the big one is being rendered
        busy, _ = await stream_ttft(c, CHAT)
        r = await task
        took = time.perf_counter() - t0
    err = r.json().get("error") or {}
    print(f"  big request: {r.status_code} in {took:.1f} s {err.get('message', '')[:80]}")
    return idle, busy, r.status_code


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    d = Daemon(max_context=4096)
    try:
        big = largest()
        rounds = [asyncio.run(one_round(d.url, big)) for _ in range(args.rounds)]
    finally:
        d.stop()
    idle = statistics.median(r[0] for r in rounds)
    busy = statistics.median(r[1] for r in rounds)
    print(f"chat TTFT idle {idle:.2f} s, beside the largest request {busy:.2f} s (target {idle + 2:.2f} s)")


if __name__ == "__main__":
    main()
