"""Where a speculative step's time goes, in the worker's runtime on the embedded model: one
forward of a lane (a 740-token context, or --context) with 1 row (a plain decode) and with 1 + k rows
(k drafts verified: a logits row for each), the same 1 + k rows with logits for the last only
(what the rows cost without the output layer), four lanes at once, and the drafters' own
time (prompt lookup and suffix trees) for one proposal. Median of --repeats, milliseconds.

    python bench/verify_cost.py [--threads 2] [--repeats 15] [--context 740] [--flash-attn auto|on|off]
                                [--model GGUF]"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from common import document

from superfluid.codec.tokenizer import Tokenizer
from superfluid.plan import LaneOpen, Run, StepPlan
from superfluid.request import SamplingParams
from superfluid.runtime.llamacpp import LlamaCppRuntime
from superfluid.runtime.registry import embedded_model
from superfluid.runtime.speculate import NgramDrafter


def ms(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--context", type=int, default=740, help="the lane's context, tokens (default 740)")
    ap.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"))
    a = ap.parse_args()
    path = a.model or embedded_model().path
    tok = Tokenizer(path)
    ctx = tok.encode(document(1, a.context * 2), parse_special=False)[:a.context]
    n = len(ctx)
    rt = LlamaCppRuntime(path, lanes=4, n_ctx=max(2048, a.context + 64), threads=a.threads, batch_tokens=512,
                         flash_attn=a.flash_attn)
    lanes = range(4)
    rt.step(StepPlan(1, opens=tuple(LaneOpen(s, SamplingParams(temperature=0)) for s in lanes)))
    step = 2
    for s in lanes:
        for i in range(0, n, 500):  # within the batch
            rt.step(StepPlan(step, runs=(Run(s, i, tuple(ctx[i:i + 500]), False),)))
            step += 1
    nxt = tuple(ctx[:17])  # any tokens: only the cost is measured

    def forward(seqs, k: int, all_logits: bool):
        def go():
            rt.forward(tuple(Run(s, n, nxt[:k + 1], True, k if all_logits else 0) for s in seqs))
            for s in seqs:
                rt.drop_tail(s, n)
        return go

    print(f"one forward, median of {a.repeats}, {a.threads} thread(s), context {n} tokens, "
          f"flash attention {a.flash_attn}, ms")
    print("| rows per lane | 1 lane, logits each row | 1 lane, logits last row | 4 lanes, logits each row |")
    print("|---:|---:|---:|---:|")
    base = None
    for k in (0, 1, 2, 4, 8, 16):
        one = ms(forward((0,), k, True), a.repeats)
        last = ms(forward((0,), k, False), a.repeats)
        four = ms(forward(tuple(lanes), k, True), a.repeats)
        base = base or one
        print(f"| {k + 1} | {one:.1f} ({one / base:.2f}x) | {last:.1f} | {four:.1f} |")
    context = [int(t) for t in ctx] + [int(t) for t in ctx[:40]]
    ngram = NgramDrafter()
    print(f"prompt lookup, one proposal of 8 over {len(context)} tokens: "
          f"{ms(lambda: ngram.propose({0: (context, 8)}), a.repeats):.3f} ms")
    try:
        from superfluid.runtime.suffix import SuffixDrafter
        sfx = SuffixDrafter()
    except Exception as e:  # noqa: BLE001 -- arctic-inference missing: say so, measure the rest
        print(f"suffix trees: not measured ({e})")
    else:
        sfx.begin(0, "")
        sfx.propose({0: (context[:-1], 8)})  # the lane's tree built once, as a running lane has it
        print(f"suffix trees, one proposal of 8 over {len(context)} tokens (tree built): "
              f"{ms(lambda: sfx.propose({0: (context, 8)}), a.repeats):.3f} ms")
    logits = np.zeros((9, rt.info.n_vocab), dtype=np.float32)
    print(f"argmax of 9 logits rows: {ms(lambda: logits.argmax(axis=1), a.repeats):.3f} ms")
    rt.close()


if __name__ == "__main__":
    main()
