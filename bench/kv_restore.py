"""A prefix computed once: time to first token of a long conversation's next turn, cold,
warm (its KV in RAM), after a daemon restart and after 32 other conversations evicted it from
RAM (both restored from the disk tier). Also the disk bytes per token of KV.

    python bench/kv_restore.py [--words 1000] [--scale] [--rounds 3]

--scale runs a ~6,000-token conversation as well. Target: after a restart and after
eviction, TTFT <= 0.1 x cold at ~1,500 tokens, and better at 6,000."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx
from common import Daemon, document, metric

MODEL = "SmolLM2-135M-Instruct"  # the embedded model


def turn(url: str, messages: list[dict], max_tokens: int = 8) -> tuple[float, int, int, str]:
    """(TTFT, prompt tokens, cached tokens, text) of one greedy streamed turn."""
    t0 = time.perf_counter()
    ttft, text, usage = None, "", {}
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            for c in ev.get("choices", []):
                piece = (c.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            if ev.get("usage"):
                usage = ev["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return (ttft if ttft is not None else time.perf_counter() - t0), usage.get("prompt_tokens", 0), cached, text


def conversation(seed: int, words: int) -> list[dict]:
    return [{"role": "system", "content": "You are a careful reader. Answer briefly."},
            {"role": "user", "content": f"Here is a document:\n{document(seed, words)}\n\nWhat is its first word?"}]


def run_case(words: int, ctx: int, rounds: int) -> dict:
    rows: dict[str, list[float]] = {"cold": [], "warm": [], "after restart": [], "after eviction": []}
    cached: dict[str, int] = {}
    per_token = []
    prompt_tokens = 0
    for r in range(rounds):
        home = None
        d = Daemon(max_context=ctx, max_batch=8)
        try:
            home = d.home
            msgs = conversation(1000 * r + words, words)
            t, prompt_tokens, c, _ = turn(d.url, msgs)
            rows["cold"].append(t)
            t, _, c, _ = turn(d.url, msgs)
            rows["warm"].append(t)
            cached["warm"] = c
            time.sleep(1.0)  # the writer thread puts the entry on disk
            files = list(Path(home, "kv").glob("*/*.kv"))
            if files:
                per_token.append(max(f.stat().st_size for f in files) / prompt_tokens)
        finally:
            d.stop()
        d = Daemon(max_context=ctx, max_batch=8, home=home)
        try:
            t, _, c, _ = turn(d.url, msgs)
            rows["after restart"].append(t)
            cached["after restart"] = c
            for i in range(32):  # 32 other conversations take every RAM slot (16 by default); each
                # starts differently, so none reuses another's slot in place
                turn(d.url, [{"role": "system", "content": f"{i} {document(5000 + i, 8)}"},
                             {"role": "user", "content": document(6000 + i, 60)}], 1)
            t, _, c, _ = turn(d.url, msgs)
            rows["after eviction"].append(t)
            cached["after eviction"] = c
            cached["restores"] = int(metric(d.url, "superfluid_restores_total"))
            cached["ram evictions"] = int(metric(d.url, "superfluid_evictions_total"))
        finally:
            d.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {"prompt_tokens": prompt_tokens, "ttft_s": med, "cached_tokens": cached,
            "ratio_to_cold": {k: med[k] / med["cold"] for k in med},
            "disk_bytes_per_token": statistics.median(per_token) if per_token else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=1400)
    ap.add_argument("--scale", action="store_true", help="also a ~6,000-token conversation")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    cases = [(a.words, 4096)] + ([(4 * a.words, 8192)] if a.scale else [])
    for words, ctx in cases:
        res = run_case(words, ctx, a.rounds)
        print(f"\n~{res['prompt_tokens']} prompt tokens, median of {a.rounds} rounds")
        for k, v in res["ttft_s"].items():
            print(f"  {k:15s} TTFT {v:7.3f} s   {res['ratio_to_cold'][k]:.3f} x cold")
        print(f"  cached tokens: {res['cached_tokens']}")
        print(f"  disk bytes per token: {res['disk_bytes_per_token']:.0f}" if res["disk_bytes_per_token"] else "")


if __name__ == "__main__":
    main()
