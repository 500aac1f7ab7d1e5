"""What RoPE scaling costs in quality on a GGUF (default: the embedded model), as
docs/context.md reports it.

    python bench/rope_quality.py ppl KIND [--tokens 16384] [--scale 4]
    python bench/rope_quality.py probe [--scale 4]

`ppl`: perplexity by position bucket over the first N tokens of the licence texts in
/usr/share/common-licenses (English prose, one after another), decoded in chunks of 512 in
one context of N tokens, positions unstretched (KIND own or none) or stretched (yarn,
linear) by --scale. Prints one JSON line.

`probe`: greedy answers to four short chat questions with each kind, and a pass key stated
at the start of a ~7k- and a ~10k-token prompt, recalled or not at the end, all in a
32768-token context. Prints a JSON line per result.

Both drive llama-cpp-python's low-level API with the context parameters runtime/llamacpp.py
sets (context_params with a runtime/rope.Rope), 2 threads unless --threads."""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import llama_cpp as ll  # noqa: E402
import numpy as np  # noqa: E402

from superfluid.codec.tokenizer import quiet_llama_logs  # noqa: E402
from superfluid.runtime.llamacpp_params import context_params  # noqa: E402
from superfluid.runtime.registry import embedded_model  # noqa: E402
from superfluid.runtime.rope import Rope  # noqa: E402

LICENCES = ["GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "LGPL-2.1", "Artistic", "CC0-1.0", "MPL-1.1", "GPL-2",
            "LGPL-2", "GFDL-1.2", "GPL-1"]
EDGES = [0, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768]
QUESTIONS = ["What is the capital of France?", "What is 2 + 2?", "Name the three primary colours.",
             "Write one sentence about the sea."]
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEY = ("There is a pass key hidden in this text. Remember it. The pass key is 68341. Remember it. "
       "68341 is the pass key.\n")


class Model:
    def __init__(self, path: str, threads: int):
        quiet_llama_logs()
        ll.llama_backend_init()
        self.model = ll.llama_model_load_from_file(path.encode(), ll.llama_model_default_params())
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.trained = ll.llama_model_n_ctx_train(self.model)  # before any context: see runtime/llamacpp.py
        self.threads = threads

    def tokens(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        b = text.encode()
        buf = (ll.llama_token * (len(b) + 8))()
        return list(buf[:ll.llama_tokenize(self.vocab, b, len(b), buf, len(buf), add_special, parse_special)])

    def piece(self, t: int) -> str:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, t, buf, 64, 0, False)  # before reading buf.raw: a copy
        return buf.raw[:n].decode(errors="replace")

    def context(self, kind: str, scale: float, n_ctx: int):
        rope = Rope("" if kind == "own" else kind, scale if kind in ("yarn", "linear") else 0.0, self.trained)
        return ll.llama_init_from_model(self.model, context_params(1, n_ctx, self.threads, 512, rope))

    def decode(self, ctx, batch, toks: list[int], pos: int, every: bool) -> None:
        """Feed toks from pos in chunks of 512; logits for every token, or the last only."""
        for s in range(0, len(toks), 512):
            chunk = toks[s:s + 512]
            for j, t in enumerate(chunk):
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = t, pos + s + j, 1
                batch.seq_id[j][0], batch.logits[j] = 0, int(every or s + j == len(toks) - 1)
            batch.n_tokens = len(chunk)
            if ll.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            if every:
                yield s, np.ctypeslib.as_array(ll.llama_get_logits(ctx), shape=(len(chunk), self.n_vocab))

    def greedy(self, kind: str, scale: float, prompt: list[int], n: int) -> str:
        ctx = self.context(kind, scale, 32768)
        batch = ll.llama_batch_init(512, 0, 1)
        out: list[int] = []
        toks, pos = prompt, 0
        while True:
            for _ in self.decode(ctx, batch, toks, pos, every=False):
                pass
            pos += len(toks)
            t = int(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(self.n_vocab,)).argmax())
            if ll.llama_vocab_is_eog(self.vocab, t) or len(out) >= n:
                break
            out.append(t)
            toks = [t]
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
        return "".join(self.piece(t) for t in out)


def perplexity(m: Model, kind: str, scale: float, n: int) -> dict:
    text = "\n\n".join(Path(f"/usr/share/common-licenses/{f}").read_text(errors="replace") for f in LICENCES)
    toks = m.tokens(text, add_special=True, parse_special=False)[:n]  # the text as text, after the model's BOS
    ctx = m.context(kind, scale, len(toks))
    batch = ll.llama_batch_init(512, 0, 1)
    nll = np.zeros(len(toks) - 1)
    t0 = time.monotonic()
    for s, logits in m.decode(ctx, batch, toks, 0, every=True):
        lg = logits.astype(np.float64)
        top = lg.max(1, keepdims=True)
        lse = np.log(np.exp(lg - top).sum(1)) + top[:, 0]
        for j in range(min(len(lg), len(toks) - 1 - s)):
            nll[s + j] = lse[j] - lg[j, toks[s + j + 1]]
    out: dict = {"kind": kind, "scale": scale if kind in ("yarn", "linear") else 1, "tokens": len(toks),
                 "s": round(time.monotonic() - t0)}
    out.update({f"{a}-{b}": round(math.exp(nll[a:b].mean()), 2)
                for a, b in zip(EDGES, EDGES[1:], strict=False) if a < len(nll)})
    return out


def probe(m: Model, scale: float) -> None:
    chat = lambda q: m.tokens(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")  # noqa: E731 (ChatML)
    for kind in ("own", "yarn", "linear"):
        answers = [m.greedy(kind, scale, chat(q), 40) for q in QUESTIONS]
        print(json.dumps({"kind": kind, "answers": answers}), flush=True)
    for repeats, kinds in ((300, ("own", "yarn")), (420, ("own", "yarn", "linear"))):
        prompt = [1] + m.tokens(KEY + FILLER * repeats + "\nWhat is the pass key? The pass key is")
        for kind in kinds:
            t0 = time.monotonic()
            said = m.greedy(kind, scale, prompt, 8)
            print(json.dumps({"kind": kind, "tokens": len(prompt), "pass_key": said,
                              "recalled": "68341" in said, "s": round(time.monotonic() - t0)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("ppl", "probe"))
    p.add_argument("kind", nargs="?", default="own", choices=("own", "none", "yarn", "linear"))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--scale", type=float, default=4.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    a = p.parse_args()
    m = Model(a.model or embedded_model().path, a.threads)
    if a.what == "ppl":
        print(json.dumps(perplexity(m, a.kind, a.scale, a.tokens)), flush=True)
    else:
        probe(m, a.scale)


if __name__ == "__main__":
    main()
