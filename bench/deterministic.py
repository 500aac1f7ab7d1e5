"""--deterministic: what the same-answer guarantee costs, through the daemon on the embedded
model (issue 37). For the default and for --deterministic, interleaved, median of --repeats:

- prefill: the time to the first token of a ~2,000-token prompt, cold, alone (tok/s);
- decode: 8 streams of 128 greedy tokens at once (aggregate tok/s, from the first token of
  the last stream to start until all end);
- a chat beside agents: the time to the first token of a ~1,000-token interactive prompt
  while 7 agent streams decode (each prefill step of --deterministic runs alone).

    python bench/deterministic.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx

from common import Daemon, document, stream_ttft

MODES = {"default": (), "deterministic": ("--deterministic",)}


def chat(text: str, n: int) -> dict:
    return {"model": "x", "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": text}]}


async def measure(d: Daemon, run: int) -> dict:
    async with httpx.AsyncClient(base_url=d.url, timeout=600) as c:
        doc = document(1000 + run, 1500)
        ttft, _ = await stream_ttft(c, chat(doc, 1), {"x-superfluid-qos": "interactive"})
        counted = await c.post("/v1/messages/count_tokens", json={"model": "x", "messages": [
            {"role": "user", "content": doc}]})
        prompt_tokens = counted.json()["input_tokens"]
        t0 = time.perf_counter()
        streams = [stream_ttft(c, chat(f"Story {run}-{i}: tell it.", 128)) for i in range(8)]
        await asyncio.gather(*streams)
        decode = 8 * 128 / (time.perf_counter() - t0)
        agents = [asyncio.create_task(stream_ttft(c, chat(f"Tale {run}-{i}.", 200), {"x-superfluid-qos": "agent"}))
                  for i in range(7)]
        await asyncio.sleep(2.0)
        beside, _ = await stream_ttft(c, chat(document(2000 + run, 700), 1), {"x-superfluid-qos": "interactive"})
        await asyncio.gather(*agents)
    return {"prefill_tps": prompt_tokens / ttft, "decode_tps": decode, "chat_beside_agents_ttft_s": beside}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    daemons = {m: Daemon(*args, max_context=4096, max_batch=8) for m, args in MODES.items()}
    got: dict[str, list[dict]] = {m: [] for m in MODES}
    try:
        for r in range(a.repeats):
            for m, d in daemons.items():
                got[m].append(asyncio.run(measure(d, r)))
    finally:
        for d in daemons.values():
            d.stop()
    out = {m: {k: round(statistics.median(x[k] for x in runs), 3) for k in runs[0]} for m, runs in got.items()}
    out["ratio"] = {k: round(out["deterministic"][k] / out["default"][k], 3) for k in out["default"]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
