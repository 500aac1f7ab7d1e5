"""One long system prompt shared by 32 simultaneous requests (each with its own short
question), against 32 requests with distinct long prompts of the same size. Reports how many
times the shared part was prefilled (from the prefill tokens the scheduler sent to the
worker) and the TTFT p50 of each burst.

    python bench/shared_prefix.py [--prefix-words 500] [--requests 32] [--no-distinct]

Target: the shared part is prefilled <= 1.2 times."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
from common import Daemon, document, metric, stream_ttft

from superfluid.codec.template import ChatTemplate
from superfluid.codec.tokenizer import Tokenizer
from superfluid.runtime.registry import resolve
from superfluid.sched.prefix import common_prefix


def messages(system: str, i: int) -> list[dict]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"Question {i}: which word comes first in part {i}?"}]


async def burst(url: str, model: str, systems: list[str]) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=1800) as c:
        outs = await asyncio.gather(*(stream_ttft(c, {"model": model, "max_tokens": 4, "temperature": 0,
                                                      "messages": messages(s, i)})
                                      for i, s in enumerate(systems)))
    return [t for t, _ in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prefix-words", type=int, default=500)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--no-distinct", action="store_true")
    a = ap.parse_args()
    src = resolve(a.model)
    tok = Tokenizer(src.path)
    tpl = ChatTemplate(tok.chat_template)
    system = document(7, a.prefix_words)
    p0 = tok.encode_prompt(tpl.render(messages(system, 0)))
    p1 = tok.encode_prompt(tpl.render(messages(system, 1)))
    shared = common_prefix(p0, p1)
    per_request = [len(tok.encode_prompt(tpl.render(messages(system, i)))) for i in range(a.requests)]
    extra = [src.path] if a.model else []
    d = Daemon(*extra, max_context=a.ctx, max_batch=8)
    try:
        before = metric(d.url, "superfluid_prefill_tokens_total")
        t0 = time.perf_counter()
        ttft_shared = asyncio.run(burst(d.url, src.id, [system] * a.requests))
        wall_shared = time.perf_counter() - t0
        prefilled = metric(d.url, "superfluid_prefill_tokens_total") - before
        cached = metric(d.url, "superfluid_cached_tokens_total")
        ttft_distinct, wall_distinct = [], 0.0
        if not a.no_distinct:
            t0 = time.perf_counter()
            ttft_distinct = asyncio.run(burst(d.url, src.id, [document(1000 + i, a.prefix_words)
                                                              for i in range(a.requests)]))
            wall_distinct = time.perf_counter() - t0
    finally:
        d.stop()
    distinct_parts = sum(n - shared for n in per_request)
    times = (prefilled - distinct_parts) / shared
    print(f"{a.requests} requests, shared prefix {shared} tokens, prompts {min(per_request)}-{max(per_request)} "
          f"tokens, 8 lanes, 1 llama.cpp thread")
    print(f"  shared burst:   prefilled {prefilled:.0f} tokens -> shared part prefilled {times:.2f} times; "
          f"{cached:.0f} tokens seeded from KV; TTFT p50 {statistics.median(ttft_shared):.2f} s; "
          f"all done in {wall_shared:.1f} s")
    if ttft_distinct:
        print(f"  distinct burst: TTFT p50 {statistics.median(ttft_distinct):.2f} s; "
              f"all done in {wall_distinct:.1f} s")


if __name__ == "__main__":
    main()
