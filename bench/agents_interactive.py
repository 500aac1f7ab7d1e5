"""A chat while agents work: 8 `background` agents, each summarizing its own long document
(their prefills keep this machine busy well over 10 s), then, 2 s later, a short chat.
Reports the chat's time to first token with `x-superfluid-qos: interactive`, without the
header, and against llama-cpp-python's own server (llama_cpp.server) in the same run.

    python bench/agents_interactive.py [--rounds 3] [--doc-words 450] [--no-peer] [--threads N]

Target: chat TTFT <= 1.0 s with the header.

`--srpt` compares shortest remaining work first (sched/srpt.py) on and off
(SUPERFLUID_SRPT=0), two daemons side by side, rounds alternating between them. The agents
send no header (the default class, `agent`), as most clients do; per round and daemon:
- no header: the chat sends none either (the agents' class); every agent runs to its end,
  and the round reports the chat's TTFT and the agents' total time (start to the last
  agent's last token);
- header: the chat sends `x-superfluid-qos: interactive`; agents are cut after its first token.
Targets (issue 15): no-header chat TTFT <= 2.0 s with SRPT, agents' total within 5% of off."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import httpx
from common import Daemon, Peer, document, metric, stream_ttft

from superfluid.runtime.registry import resolve

CHAT = [{"role": "user", "content": "Hi! What is a good name for a cat?"}]


async def agents_round(url: str, model: str, docs: list[str], chat_headers: dict, max_tokens: int,
                       finish: bool) -> tuple[float, float]:
    """(chat TTFT, agents' total seconds: start to the last one's end; nan when cut)."""
    async with httpx.AsyncClient(base_url=url, timeout=900) as c:
        t0 = time.perf_counter()

        async def agent(d: str) -> float:
            await stream_ttft(c, {"model": model, "max_tokens": max_tokens, "temperature": 0,
                                  "messages": [{"role": "user", "content": f"Summarize this document:\n{d}"}]})
            return time.perf_counter() - t0

        agents = [asyncio.create_task(agent(d)) for d in docs]
        await asyncio.sleep(2.0)
        ttft, _ = await stream_ttft(c, {"model": model, "max_tokens": 16, "temperature": 0, "messages": CHAT},
                                    chat_headers)
        total = float("nan")
        if finish:
            total = max(await asyncio.gather(*agents))
        else:
            for t in agents:
                t.cancel()
            await asyncio.gather(*agents, return_exceptions=True)
    await asyncio.sleep(1.0)
    return ttft, total


def srpt_compare(a: argparse.Namespace, model_id: str, extra: list[str]) -> None:
    daemons: dict[str, Daemon] = {}
    try:
        for name, flag in (("SRPT on", "1"), ("SRPT off", "0")):
            os.environ["SUPERFLUID_SRPT"] = flag  # the daemon inherits it
            daemons[name] = Daemon(*extra, max_context=a.ctx, max_batch=a.agents, threads=a.threads)
        os.environ.pop("SUPERFLUID_SRPT")
        res: dict[str, dict[str, list[float]]] = {n: {"plain": [], "total": [], "header": []} for n in daemons}
        for r in range(a.rounds):
            for name in (list(daemons) if r % 2 == 0 else list(daemons)[::-1]):
                d = daemons[name]
                docs = [document(100 * r + i, a.doc_words) for i in range(a.agents)]
                ttft, total = asyncio.run(agents_round(d.url, model_id, docs, {}, a.max_tokens, True))
                res[name]["plain"].append(ttft)
                res[name]["total"].append(total)
                docs = [document(100 * r + 50 + i, a.doc_words) for i in range(a.agents)]
                ttft, _ = asyncio.run(agents_round(d.url, model_id, docs, {"x-superfluid-qos": "interactive"},
                                                   a.max_tokens, False))
                res[name]["header"].append(ttft)
                print(f"round {r + 1} {name}: no-header chat TTFT {res[name]['plain'][-1]:.2f} s, agents' total "
                      f"{total:.1f} s, interactive chat TTFT {ttft:.2f} s", flush=True)
        shorts = {n: metric(d.url, "superfluid_short_preemptions_total") for n, d in daemons.items()}
        # work done, free of the machine's load: tokens prefilled (a lossy preemption would add some)
        prefilled = {n: metric(d.url, "superfluid_prefill_tokens_total") for n, d in daemons.items()}
    finally:
        for d in daemons.values():
            d.stop()
    print(f"{a.agents} agents (no header) x {a.doc_words}-word documents, chat 2 s later; median of {a.rounds} "
          f"rounds, {a.threads} llama.cpp thread(s), rounds alternating between the two daemons")
    for name, r in res.items():
        print(f"  {name:<9} no-header chat TTFT {statistics.median(r['plain']):7.2f} s   agents' total "
              f"{statistics.median(r['total']):7.1f} s   interactive chat TTFT {statistics.median(r['header']):6.2f} s"
              f"   (short preemptions {shorts[name]:.0f}, tokens prefilled {prefilled[name]:.0f})")
    on, off = (statistics.median(res[n]["total"]) for n in daemons)
    print(f"  agents' total, on / off: {on / off:.3f}")


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
    ap.add_argument("--srpt", action="store_true", help="compare shortest remaining work first on and off")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: every core, the default)")
    a = ap.parse_args()
    a.threads = a.threads or len(os.sched_getaffinity(0))
    src = resolve(a.model)
    extra = [src.path] if a.model else []
    if a.srpt:
        return srpt_compare(a, src.id, extra)
    results: dict[str, list[float]] = {"superfluid, interactive header": [], "superfluid, no header": []}
    d = Daemon(*extra, max_context=a.ctx, max_batch=a.agents, threads=a.threads)
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
        p = Peer(src.path, a.ctx, a.threads)
        try:
            for r in range(a.rounds):
                docs = [document(100 * r + 70 + i, a.doc_words) for i in range(a.agents)]
                results["llama_cpp.server"].append(asyncio.run(one_round(p.url, "peer", docs, {}, {}, a.max_tokens)))
        finally:
            p.stop()
    print(f"{a.agents} background agents x {a.doc_words}-word documents, chat 2 s later; "
          f"median of {a.rounds} rounds, {a.threads} llama.cpp thread(s)")
    for name, xs in results.items():
        print(f"  {name:<32} chat TTFT {statistics.median(xs):7.2f} s   (rounds: {', '.join(f'{x:.2f}' for x in xs)})")


if __name__ == "__main__":
    main()
