"""Aggregate completion tokens/s through the daemon vs a raw llama-cpp-python batched
decode loop (the physical limit for this runtime), at 1, 2, 4 and 8 concurrent requests.

    python bench/throughput.py [--model PATH] [--max-tokens 128] [--rounds 5] [--stream] [--peer]

Both sides: the same GGUF, the same thread count, the same context layout (lanes x ctx,
one KV stream per lane), distinct prompts, greedy, run to length (EOS ignored); the time
counts prefill and decode, from the first request sent to the last token received. Prints
the median of the rounds and the ratio daemon / raw.

--peer adds llama-server (the xllamacpp wheel, bench only) with as many parallel slots as the
daemon has lanes, both at their default thread counts (--threads 0: ours is every core, its
is llama.cpp's), and a cold-TTFT row: a distinct ~1,500-token prompt per round, streamed,
seconds to the first token on each (the raw loop then runs at the daemon's thread count).

--busy keeps one core busy with another process through every measurement, as an editor, a
browser or a build does on the machine people run the daemon on."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from superfluid.config import THREAD_ENV  # noqa: E402

for _k, _v in THREAD_ENV.items():  # the raw loop waits as the daemon's worker does (read when OpenMP loads)
    os.environ.setdefault(_k, _v)
import llama_cpp as ll  # noqa: E402
import numpy as np  # noqa: E402

from superfluid.codec.template import ChatTemplate  # noqa: E402
from superfluid.codec.tokenizer import Tokenizer, quiet_llama_logs  # noqa: E402
from superfluid.runtime.llamacpp_params import context_params, model_params  # noqa: E402
from superfluid.runtime.registry import resolve  # noqa: E402
from tests.integration.daemon import Daemon  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LlamaServerProcess, document, stream_ttft  # noqa: E402

TOPICS = ["the sea", "a mountain", "a robot", "a city at night", "an old library", "a desert",
          "a violin", "the moon", "a garden", "a train journey", "winter", "a lighthouse"]


def conversation(text: str) -> list[dict]:
    # the topic opens the system turn: requests share no prefix worth caching, so the daemon
    # prefills exactly what the raw loop does
    return [{"role": "system", "content": text + " You are a helpful writer."},
            {"role": "user", "content": "Go on, write it."}]


def prompts(n: int, offset: int) -> list[str]:
    # a unique tag first: a prompt repeated from an earlier round would come from the prefix cache
    return [f"[{offset}.{n}.{i}] Write a long story about {TOPICS[(offset + i) % len(TOPICS)]}." for i in range(n)]


class RawLoop:
    """The same work with no daemon: one process, one context, one llama_decode per step."""

    def __init__(self, path: str, lanes: int, n_ctx: int, threads: int, batch: int):
        quiet_llama_logs()
        ll.llama_backend_init()
        self.model = ll.llama_model_load_from_file(path.encode(), model_params())
        self.ctx = ll.llama_init_from_model(self.model, context_params(lanes, n_ctx, threads, batch))
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(batch, 0, 1)
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.cap = batch
        self.decode_s = 0.0

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(items)
        if ll.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def _argmax(self, i: int) -> int:
        return int(np.argmax(np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))))

    def run(self, toks: list[list[int]], max_tokens: int) -> int:
        for s in range(len(toks)):
            ll.llama_memory_seq_rm(self.mem, s, -1, -1)
        # prefill, chunked to the batch size like the daemon's step budget
        last: dict[int, int] = {}
        items: list[tuple[int, int, int, bool]] = []
        owners: list[tuple[int, int]] = []

        def flush():
            self._decode(items)
            for s, idx in owners:
                last[s] = self._argmax(idx)
            items.clear()
            owners.clear()

        for s, t in enumerate(toks):
            for p, tok in enumerate(t):
                end = p == len(t) - 1
                items.append((tok, p, s, end))
                if end:
                    owners.append((s, len(items) - 1))
                if len(items) == self.cap:
                    flush()
        if items:
            flush()
        produced = len(toks)
        pos = [len(t) for t in toks]
        t0 = time.perf_counter()
        for _ in range(max_tokens - 1):
            order = list(range(len(toks)))
            self._decode([(last[s], pos[s], s, True) for s in order])
            for i, s in enumerate(order):
                last[s] = self._argmax(i)
                pos[s] += 1
            produced += len(toks)
        self.decode_s = time.perf_counter() - t0  # the decode steps alone (bench/builds.py)
        return produced


async def daemon_round(url: str, model: str, texts: list[str], max_tokens: int, stream: bool) -> tuple[int, float]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        async def one(text: str) -> int:
            body = {"model": model, "messages": conversation(text), "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True, "stream": stream}
            if stream:  # llama-server counts a stream's tokens in its last chunk only when asked
                body["stream_options"] = {"include_usage": True}
            if not stream:
                r = await c.post("/v1/chat/completions", json=body)
                return r.json()["usage"]["completion_tokens"]
            n = 0
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if '"usage"' in line:
                        import json
                        n = json.loads(line[6:])["usage"]["completion_tokens"]
            return n

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(t) for t in texts))
        return sum(counts), time.perf_counter() - t0


def cold_prompt(r: int, tok: Tokenizer, tpl: ChatTemplate, target: int = 1500) -> list[dict]:
    """A distinct conversation of about `target` prompt tokens (nothing cached anywhere)."""
    words = 1000
    for _ in range(4):
        msgs = [{"role": "user", "content": f"[cold {r}] Summarise this: " + document(r, words)}]
        n = len(tok.encode_prompt(tpl.render(msgs)))
        words = max(50, int(words * target / n))
    return msgs


def ttft(url: str, msgs: list[dict]) -> float:
    async def go() -> float:
        async with httpx.AsyncClient(base_url=url, timeout=600) as c:
            return (await stream_ttft(c, {"messages": msgs, "max_tokens": 4, "temperature": 0, "ignore_eos": True}))[0]
    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=1, help="0: every core (the daemon's default)")
    ap.add_argument("--peer-default", action="store_true", help="llama-server at llama.cpp's own thread default")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--peer", action="store_true", help="add llama-server (xllamacpp) and a cold-TTFT row")
    ap.add_argument("--busy", action="store_true", help="another process keeps one core busy while measuring")
    ap.add_argument("--daemon-arg", action="append", default=[], metavar="ARG",
                    help="one more argument of the daemon (repeat: --daemon-arg=--stream-interval-ms --daemon-arg=0)")
    a = ap.parse_args()
    if a.threads <= 0:  # the daemon's default: every core this process may use
        a.threads = len(os.sched_getaffinity(0))
    if a.peer:
        a.ctx = max(a.ctx, 2048)  # room for the cold ~1,500-token prompt in a lane (a slot)
    src = resolve(a.model)
    levels = [int(x) for x in a.levels.split(",")]
    lanes = max(levels)
    tok = Tokenizer(src.path)
    tpl = ChatTemplate(tok.chat_template)
    extra = [src.path] if a.model else []
    d = Daemon(*extra, *a.daemon_arg, max_context=a.ctx, max_batch=lanes, threads=a.threads)
    d_id = src.id
    peer = LlamaServerProcess(src.path, 0 if a.peer_default else a.threads, lanes * a.ctx, lanes) if a.peer else None
    raw = RawLoop(src.path, lanes, a.ctx, a.threads, 256)
    results: dict[int, tuple[list[float], list[float], list[float]]] = {n: ([], [], []) for n in levels}
    cold: tuple[list[float], list[float]] = ([], [])
    busy = None
    try:
        asyncio.run(daemon_round(d.url, d_id, prompts(1, 0), 8, a.stream))  # warm up both
        raw.run([tok.encode_prompt(tpl.render([{"role": "user", "content": "hi"}]))], 8)
        if a.busy:
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for r in range(a.rounds):
            for n in levels:
                texts = prompts(n, r * 3)
                toks = [tok.encode_prompt(tpl.render(conversation(t))) for t in texts]
                # alternate who goes first, so drift on a shared machine hits every side alike
                sides = [0, 1] + ([2] if peer else [])
                for side in (sides if r % 2 == 0 else sides[::-1]):
                    if side == 1:
                        t0 = time.perf_counter()
                        produced = raw.run(toks, a.max_tokens)
                        dt = time.perf_counter() - t0
                    else:
                        url = d.url if side == 0 else peer.url  # type: ignore[union-attr]
                        produced, dt = asyncio.run(daemon_round(url, d_id, texts, a.max_tokens, a.stream))
                    results[n][side].append(produced / dt)
            if peer:
                msgs = cold_prompt(r, tok, tpl)
                for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                    cold[side].append(ttft(d.url if side == 0 else peer.url, msgs))
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        d.stop()
        if peer:
            peer.stop()
    print(f"model {d_id}, threads {a.threads}, {a.max_tokens} tokens per request, "
          f"{'streaming' if a.stream else 'non-streaming'}, median of {a.rounds} rounds"
          + (", one core kept busy by another process" if a.busy else ""))
    head = f"{'concurrent':>10} {'daemon tok/s':>13} {'raw tok/s':>10} {'ratio':>6}"
    print(head + (f" {'llama-server tok/s':>19} {'daemon/llama-server':>20}" if peer else ""))
    for n in levels:
        dm, rm = statistics.median(results[n][0]), statistics.median(results[n][1])
        row = f"{n:>10} {dm:>13.1f} {rm:>10.1f} {dm / rm:>6.3f}"
        if peer:
            pm = statistics.median(results[n][2])
            row += f" {pm:>19.1f} {dm / pm:>20.3f}"
        print(row)
    if peer:
        dc, pc = statistics.median(cold[0]), statistics.median(cold[1])
        print(f"cold TTFT of a ~1,500-token prompt: daemon {dc:.2f} s, llama-server {pc:.2f} s "
              f"(daemon / llama-server {dc / pc:.3f})")


if __name__ == "__main__":
    main()
