"""Single-stream decode speed with and without speculative decoding, same run, same model,
same threads, greedy:

- edit: a 300-line Python file, "return it with one function renamed" (the output mostly
  repeats the input: prompt-lookup drafts are accepted);
- free chat: open questions, nothing to copy (speculation must not slow them down).

Compared: superfluid --speculative off, superfluid --speculative ngram, superfluid
--speculative draft (a draft model: the embedded model cut to its first --draft-layers layers,
tests/integration/draft_gguf.py, or --draft-model GGUF), and llama-server (the xllamacpp
wheel's embedded server) with its n-gram speculation (ngram-simple) at its defaults.
Decode tok/s = (completion tokens - 1) / (last token time - first token time), median of
--rounds; the prompt is warm (cached) after the first round on every server.

    python bench/speculative.py [--rounds 3] [--threads 1] [--tokens 256] [--draft-layers 4 | --draft-model GGUF]
Needs: pip install xllamacpp (bench only)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
from common import Daemon, LlamaServer, metric

from superfluid.runtime.registry import embedded_model
from tests.integration.draft_gguf import draft_gguf

MODEL = "SmolLM2-135M-Instruct"


def source_file(lines: int = 300) -> str:
    """A deterministic Python module of about `lines` lines."""
    out = ['"""Inventory records: parsing, checking and summing."""', "", "import math", ""]
    i = 0
    while len(out) < lines:
        out += [f"def parse_line_{i}(line):", f'    """Split record {i} into its fields."""',
                "    fields = line.strip().split(',')", f"    if len(fields) != {3 + i % 4}:",
                f"        raise ValueError('record {i} has the wrong number of fields')",
                f"    return [field.strip() for field in fields][:{3 + i % 4}]", "",
                f"def total_{i}(rows):", f"    return sum(float(r[{i % 3}]) for r in rows) * {1 + i % 5}", ""]
        i += 1
    return "\n".join(out[:lines])


CODE = source_file()
# The embedded 135M model answers a chat "rename this function" with a code fence and stops,
# so the edit is asked as a completion it continues: the file again, its first lines given.
EDIT = {"prompt": "Here is a Python file:\n\n" + CODE + "\n\nHere is the same file with parse_line_3 renamed to "
                  "read_line_3:\n\n" + "\n".join(CODE.splitlines()[:2]) + "\n"}
FREE = [{"messages": [{"role": "user", "content": q}]} for q in (
    "Why do cats purr? Answer in a paragraph.",
    "Describe a walk through a forest in autumn.",
    "What makes a good team leader? Give some thoughts.")]


def ngram(p, x) -> None:
    """llama-server's n-gram speculation (ngram-simple) at its defaults, one slot."""
    p.speculative.types = [x.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]


def decode_rate(url: str, body: dict, tokens: int) -> tuple[float, int]:
    """(decode tok/s, completion tokens) of one greedy streamed chat (body has messages) or
    completion (body has a prompt)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    body = {"model": MODEL, **body, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    first = last = None
    n = 0
    with httpx.stream("POST", url + path, json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                n = d["usage"]["completion_tokens"]
            if any((c.get("delta") or {}).get("content") or c.get("text") for c in d.get("choices") or []):
                last = time.perf_counter()
                first = first or last
    if first is None or last is None or last <= first or n < 2:
        return float("nan"), n
    return (n - 1) / (last - first), n


def acceptance(url: str) -> tuple[float, float]:
    return metric(url, "superfluid_draft_tokens_total"), metric(url, "superfluid_draft_accepted_tokens_total")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--draft-layers", type=int, default=4, help="the draft model: the embedded model's first N layers")
    ap.add_argument("--draft-model", help="the draft model's GGUF instead (the embedded model's vocabulary)")
    a = ap.parse_args()
    n_ctx = 8192
    draft = a.draft_model or draft_gguf(a.draft_layers)
    servers = {"off": Daemon("--speculative", "off", threads=a.threads, max_context=n_ctx, max_batch=1),
               "ngram": Daemon("--speculative", "ngram", threads=a.threads, max_context=n_ctx, max_batch=1),
               "draft": Daemon("--speculative", "draft", "--draft-model", draft, threads=a.threads,
                               max_context=n_ctx, max_batch=1)}
    urls = {k: d.url for k, d in servers.items()}
    peer = LlamaServer(embedded_model().path, a.threads, n_ctx, ngram)
    urls["llama-server ngram"] = peer.url
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        for url in urls.values():  # warm: the edit prompt prefilled and cached everywhere
            decode_rate(url, EDIT, 8)
        drafts = {(work, name): [0.0, 0.0] for work in ("edit", "free") for name in ("ngram", "draft")}
        for _ in range(a.rounds):
            for name, url in urls.items():  # interleaved: a noisy moment hits every server alike
                for work, bodies in (("edit", [EDIT]), ("free", FREE)):
                    before = acceptance(url) if name in ("ngram", "draft") else (0.0, 0.0)
                    rates.setdefault((work, name), []).append(
                        statistics.median(decode_rate(url, b, a.tokens)[0] for b in bodies))
                    if name in ("ngram", "draft"):
                        after = acceptance(url)
                        drafts[(work, name)][0] += after[0] - before[0]
                        drafts[(work, name)][1] += after[1] - before[1]
    finally:
        for d in servers.values():
            d.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"decode tok/s, median of {a.rounds} rounds, {a.threads} thread(s), {a.tokens} tokens, greedy; "
          f"draft model {draft}")
    for work in ("edit", "free"):
        row = "  ".join(f"{name} {med[(work, name)]:.1f}" for name in urls)
        print(f"{work:5s} {row}")
        print(f"      ngram / off = {med[(work, 'ngram')] / med[(work, 'off')]:.2f}x, "
              f"ngram / llama-server ngram = {med[(work, 'ngram')] / med[(work, 'llama-server ngram')]:.2f}x, "
              f"draft / off = {med[(work, 'draft')] / med[(work, 'off')]:.2f}x")
        for name in ("ngram", "draft"):
            n, ok = drafts[(work, name)]
            print(f"      {name}: drafted {n:.0f}, accepted {ok / max(1.0, n):.0%}")


if __name__ == "__main__":
    main()
