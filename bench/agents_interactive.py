"""A chat while agents work: 8 `background` agents, each summarizing its own long document
(their prefills keep this machine busy well over 10 s), then, 2 s later, a short chat.
Reports the chat's time to first token with `x-superfluid-qos: interactive`, without the
header, and against llama-cpp-python's own server (llama_cpp.server) in the same run.

    python bench/agents_interactive.py [--rounds 3] [--doc-words 450] [--no-peer]

Target: chat TTFT <= 1.0 s with the header."""

from __future__ import annotations

import argparse
import asyncio
import statistics

import httpx
from common import Daemon, Peer, document, stream_ttft

from superfluid.runtime.registry import resolve

CHAT = [{"role": "user", "content": "Hi! What is a good name for a cat?"}]


async def one_round(url: str, model: str, docs: list[str], chat_headers: dict, agent_headers: dict,
                    max_tokens: int) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        agents = [asyncio.create_task(stream_ttft(c, {
            "model": model, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Summarize this document:\n{d}"}]}, agent_headers))
            for d in docs]
        await asyncio.sleep(2.0)
        ttft, _ = await stream_ttft(c, {"model": model, "max_tokens": 16, "temperature": 0, "messages": CHAT},
                                    chat_headers)
        for t in agents:  # hang up on the agents: the next round starts clean
            t.cancel()
        await asyncio.gather(*agents, return_exceptions=True)
    await asyncio.sleep(1.0)
    return ttft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--doc-words", type=int, default=450)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--no-peer", action="store_true")
    a = ap.parse_args()
    src = resolve(a.model)
    extra = [src.path] if a.model else []
    results: dict[str, list[float]] = {"superfluid, interactive header": [], "superfluid, no header": []}
    d = Daemon(*extra, max_context=a.ctx, max_batch=a.agents)
    try:
        for r in range(a.rounds):
            docs = [document(100 * r + i, a.doc_words) for i in range(a.agents)]
            bg = {"x-superfluid-qos": "background"}
            results["superfluid, interactive header"].append(asyncio.run(one_round(
                d.url, src.id, docs, {"x-superfluid-qos": "interactive"}, bg, a.max_tokens)))
            docs = [document(100 * r + 50 + i, a.doc_words) for i in range(a.agents)]
            results["superfluid, no header"].append(asyncio.run(one_round(
                d.url, src.id, docs, {}, bg, a.max_tokens)))
    finally:
        d.stop()
    if not a.no_peer:
        results["llama_cpp.server"] = []
        p = Peer(src.path, a.ctx, 1)
        try:
            for r in range(a.rounds):
                docs = [document(100 * r + 70 + i, a.doc_words) for i in range(a.agents)]
                results["llama_cpp.server"].append(asyncio.run(one_round(p.url, "peer", docs, {}, {}, a.max_tokens)))
        finally:
            p.stop()
    print(f"{a.agents} background agents x {a.doc_words}-word documents, chat 2 s later; "
          f"median of {a.rounds} rounds, 1 llama.cpp thread")
    for name, xs in results.items():
        print(f"  {name:<32} chat TTFT {statistics.median(xs):7.2f} s   (rounds: {', '.join(f'{x:.2f}' for x in xs)})")


if __name__ == "__main__":
    main()
