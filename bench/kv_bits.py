"""--kv-bits: what a quantized KV cache saves and costs, on the embedded model (issue 34).

For each width (16: f16, 8: q8_0, 4: q4_0):
- KV bytes per token: a lane's llama.cpp state after a 512-token prompt, over its tokens;
- prefill and decode tok/s at 8 lanes, through the product's runtime (LlamaCppRuntime, the
  worker's): 8 prompts of 512 tokens prefilled, then 64 tokens decoded in all 8 lanes at once
  (median of --repeats runs, widths interleaved);
- the longest window 8 lanes get in the memory the f16 cache takes at 8 lanes x 8,192 tokens;
- greedy agreement with f16: over 20 prompts of 512 tokens (the repo's docs, cut), the f16
  model's greedy continuation (64 tokens) is fed to the quantized one, and the share of
  positions where its top token is the same is counted (teacher-forced, so one early flip does
  not count every later token); also the share of each greedy run that matches f16's before
  the first difference;
- perplexity on a fixed text (README.md, its first 2,048 tokens), and its difference from f16.
Greedy agreement and perplexity run on llama_cpp.Llama with the same cache types and flash
attention, which gives every position's logits.

    python bench/kv_bits.py [--repeats 3] [--prompts 20]
Targets: at 8 bits, memory <= 55% of f16, agreement >= 95%, decode >= 0.95x.
"""

from __future__ import annotations

import argparse
import glob
import statistics
import time

import numpy as np

import common  # noqa: F401  (the repo on sys.path)
from superfluid.codec.tokenizer import Tokenizer
from superfluid.plan import PLACEHOLDER, LaneOpen, Run, StepPlan
from superfluid.request import SamplingParams
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.llamacpp_params import KV_TYPES
from superfluid.runtime.registry import embedded_model

WIDTHS = (16, 8, 4)
LANES, PROMPT, DECODE, CONT = 8, 512, 64, 64


def texts(tok: Tokenizer, n: int, length: int) -> list[list[int]]:
    """n distinct 512-token prompts cut from the repo's docs."""
    ids: list[int] = []
    for path in sorted(glob.glob(str(common.ROOT / "docs" / "*.md"))):
        ids += tok.encode(open(path, encoding="utf-8").read())
    step = max(length, (len(ids) - length) // n)
    return [ids[i * step:i * step + length] for i in range(n) if i * step + length <= len(ids)]


def throughput(bits: int, prompts: list[list[int]]) -> tuple[float, float, int]:
    """(prefill tok/s, decode tok/s at LANES lanes, KV bytes per token) at `bits`."""
    rt = LlamaCppRuntime(embedded_model().path, lanes=LANES, n_ctx=PROMPT + DECODE + 8, threads=2,
                         batch_tokens=PROMPT, kv_bits=bits)
    try:
        n = 0

        def step(**kw):
            nonlocal n
            n += 1
            return rt.step(StepPlan(n, **kw))

        greedy = SamplingParams(temperature=0)
        step(opens=tuple(LaneOpen(i, greedy) for i in range(LANES)))
        t0 = time.perf_counter()
        for i, p in enumerate(prompts[:LANES]):
            step(runs=(Run(i, 0, tuple(p), True),))
        prefill = LANES * PROMPT / (time.perf_counter() - t0)
        per_token = len(rt.save_state(0, PROMPT) or b"") / PROMPT
        t0 = time.perf_counter()
        for k in range(DECODE):
            step(runs=tuple(Run(i, PROMPT + k, (PLACEHOLDER,), True) for i in range(LANES)))
        decode = LANES * DECODE / (time.perf_counter() - t0)
        return prefill, decode, round(per_token)
    finally:
        rt.close()


def llama(bits: int, n_ctx: int):
    import llama_cpp
    return llama_cpp.Llama(embedded_model().path, n_ctx=n_ctx, n_batch=512, n_threads=2, logits_all=True,
                           type_k=KV_TYPES[bits], type_v=KV_TYPES[bits], flash_attn=bits != 16, verbose=False)


def top_tokens(m, tokens: list[int]) -> np.ndarray:
    m.reset()
    m.eval(tokens)
    return np.asarray(m.scores[:len(tokens)]).argmax(axis=1)


def greedy_run(m, prompt: list[int], n: int) -> list[int]:
    m.reset()
    m.eval(prompt)
    out: list[int] = []
    for _ in range(n):
        t = int(np.argmax(m.scores[m.n_tokens - 1]))
        out.append(t)
        m.eval([t])
    return out


def perplexity(m, tokens: list[int]) -> float:
    m.reset()
    m.eval(tokens)
    logits = np.asarray(m.scores[:len(tokens) - 1], dtype=np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(tokens) - 1), tokens[1:]].mean()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=20)
    a = ap.parse_args()
    tok = Tokenizer(embedded_model().path)
    prompts = texts(tok, max(a.prompts, LANES), PROMPT)
    runs: dict[int, list[tuple[float, float, int]]] = {b: [] for b in WIDTHS}
    for _ in range(a.repeats):
        for b in WIDTHS:
            runs[b].append(throughput(b, prompts))
    readme = tok.encode(open(common.ROOT / "README.md", encoding="utf-8").read())[:2048]
    models = {b: llama(b, 4096) for b in WIDTHS}
    ref_runs = {i: greedy_run(models[16], p, CONT) for i, p in enumerate(prompts[:a.prompts])}
    ref_top = {i: top_tokens(models[16], p + ref_runs[i]) for i, p in enumerate(prompts[:a.prompts])}
    ppl16 = perplexity(models[16], readme)
    print(f"embedded model, {LANES} lanes, {PROMPT}-token prompts, medians of {a.repeats} runs; "
          f"agreement over {len(ref_runs)} prompts x {CONT} greedy tokens")
    print("| bits | KV bytes/token | vs f16 | prefill tok/s | decode tok/s | decode vs f16 | window at 8 lanes "
          "in f16's 8x8192 | top-1 agreement | greedy prefix agreement | perplexity | vs f16 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = {k: statistics.median(r[k] for r in runs[16]) for k in range(3)}
    budget = base[2] * LANES * 8192
    for b in WIDTHS:
        prefill, decode, per_token = (statistics.median(r[k] for r in runs[b]) for k in range(3))
        agree = prefix = total = 0
        for i, p in enumerate(prompts[:a.prompts]):
            seq = p + ref_runs[i]
            top = top_tokens(models[b], seq) if b != 16 else ref_top[i]
            agree += int((top[len(p) - 1:-1] == ref_top[i][len(p) - 1:-1]).sum())
            mine = greedy_run(models[b], p, CONT) if b != 16 else ref_runs[i]
            same = next((k for k, (x, y) in enumerate(zip(mine, ref_runs[i], strict=True)) if x != y), CONT)
            prefix += same
            total += CONT
        ppl = perplexity(models[b], readme) if b != 16 else ppl16
        window = int(budget // (LANES * per_token))
        print(f"| {b} | {per_token:,.0f} | {per_token / base[2]:.2f} | {prefill:,.0f} | {decode:,.1f} | "
              f"{decode / base[1]:.2f}x | {window:,} | {agree / total:.1%} | {prefix / total:.1%} | {ppl:.3f} | "
              f"{ppl - ppl16:+.3f} |")


if __name__ == "__main__":
    main()
