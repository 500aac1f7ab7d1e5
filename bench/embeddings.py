"""Embedding throughput against the peers, and a chat's time to first token while a big
indexing job runs on the same model.

    python bench/embeddings.py [--chunks 2000] [--words 150] [--rounds 3] [--threads 2]

1. GGUF (the embedded SmolLM2, mean pooling): the daemon vs llama-server (the prebuilt
   xllamacpp wheel's embedded server, --embedding, 8 slots), same file, same threads.
2. all-MiniLM-L6-v2: the daemon (--embedding-model default) vs sentence-transformers'
   encode with its default batch size (32), same torch threads.
   Both: `chunks` distinct texts of about `words` words, sent as an indexer does (requests
   of 64 inputs, 4 at a time); texts/s and tokens/s, median of the rounds, ratio daemon/peer.
3. Chat TTFT (a streamed chat, 8 tokens) while the daemon indexes all the chunks with the
   GGUF, with and without `x-superfluid-qos: interactive`: the median of 5 probes.
Needs: pip install xllamacpp sentence-transformers (bench only)."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import httpx

from common import Daemon, LlamaServer, document, stream_ttft

from superfluid.runtime.registry import EMBEDDED_ID, EMBEDDING_ID, embedded_embedding_model, embedded_model

BATCH, CONCURRENCY = 64, 4


async def index(url: str, model: str | None, texts: list[str]) -> int:
    """Embed every text (requests of BATCH, CONCURRENCY at a time); the prompt tokens counted."""
    batches = [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]
    tokens = 0
    sem = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=3600) as c:
        async def one(b: list[str]) -> None:
            nonlocal tokens
            async with sem:
                body = {"input": b, **({"model": model} if model else {})}
                r = await c.post("/v1/embeddings", json=body)
                r.raise_for_status()
                data = r.json()
                assert len(data["data"]) == len(b)
                tokens += (data.get("usage") or {}).get("prompt_tokens", 0)
        await asyncio.gather(*(one(b) for b in batches))
    return tokens


def timed(fn) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = fn()
    return time.perf_counter() - t0, n


def embedding_params(p, x) -> None:
    """llama-server serving mean-pooled embeddings, 8 slots."""
    p.embedding = True
    p.pooling_type = x.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    p.n_parallel = 8
    p.n_batch = p.n_ubatch = 2048


def gguf(a, texts: list[str]) -> None:
    home = tempfile.mkdtemp(prefix="sf-bench-emb-")
    d = Daemon("--sessions-cache", home=home, threads=a.threads, max_context=1024)
    peer = LlamaServer(embedded_model().path, a.threads, 8 * 512, embedding_params)
    ours, theirs = [], []
    try:
        asyncio.run(index(d.url, EMBEDDED_ID, texts[:64]))  # warm up both
        asyncio.run(index(peer.url, None, texts[:64]))
        for _ in range(a.rounds):
            s, n_ours = timed(lambda: asyncio.run(index(d.url, EMBEDDED_ID, texts)))
            ours.append(s)
            s, _ = timed(lambda: asyncio.run(index(peer.url, None, texts)))
            theirs.append(s)
        report("SmolLM2 GGUF (mean)", "llama-server", len(texts), n_ours, ours, theirs)
        ttft(a, d, texts)
    finally:
        d.stop()


def minilm(a, texts: list[str]) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    home = tempfile.mkdtemp(prefix="sf-bench-emb-")
    d = Daemon("--sessions-cache", "--embedding-model", "default", home=home, threads=a.threads)
    torch.set_num_threads(a.threads)
    os.environ["SUPERFLUID_HOME"] = home
    st = SentenceTransformer(embedded_embedding_model().path, device="cpu")
    ours, theirs = [], []
    try:
        asyncio.run(index(d.url, EMBEDDING_ID, texts[:64]))
        st.encode(texts[:64])
        for _ in range(a.rounds):
            s, n_ours = timed(lambda: asyncio.run(index(d.url, EMBEDDING_ID, texts)))
            ours.append(s)
            s, _ = timed(lambda: len(st.encode(texts)))
            theirs.append(s)
        report("all-MiniLM-L6-v2", "sentence-transformers encode", len(texts), n_ours, ours, theirs)
    finally:
        d.stop()


def report(name: str, peer: str, n: int, tokens: int, ours: list[float], theirs: list[float]) -> None:
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"{name}: daemon {n / o:.1f} texts/s ({tokens / o:.0f} tok/s, {o:.1f} s); {peer} {n / t:.1f} texts/s "
          f"({t:.1f} s); daemon/peer {t / o:.3f}  [rounds: {[round(x, 1) for x in ours]} vs "
          f"{[round(x, 1) for x in theirs]}]", flush=True)


def ttft(a, d: Daemon, texts: list[str]) -> None:
    """Chat probes while the whole corpus is being indexed on the same model."""
    async def run(headers: dict) -> list[float]:
        job = asyncio.create_task(index(d.url, EMBEDDED_ID, texts))
        await asyncio.sleep(2.0)  # the indexer has every lane of work queued
        out = []
        async with httpx.AsyncClient(base_url=d.url, timeout=600) as c:
            for i in range(5):
                body = {"model": EMBEDDED_ID, "max_tokens": 8, "temperature": 0,
                        "messages": [{"role": "user", "content": f"Say hello to guest {i}."}]}
                t, _ = await stream_ttft(c, body, headers)
                out.append(t)
                await asyncio.sleep(0.5)
        busy = not job.done()
        await job
        assert busy, "the indexing job ended before the probes: use more --chunks"
        return out

    for label, headers in (("no header", {}), ("interactive", {"x-superfluid-qos": "interactive"})):
        got = asyncio.run(run(headers))
        print(f"chat TTFT while indexing {len(texts)} chunks ({label}): median {statistics.median(got):.3f} s, "
              f"max {max(got):.3f} s  {[round(x, 3) for x in got]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--words", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=("gguf", "minilm"))
    a = ap.parse_args()
    texts = [f"{i}: {document(i, a.words)}" for i in range(a.chunks)]
    print(f"{a.chunks} chunks of ~{a.words} words, {a.threads} threads, {a.rounds} rounds", flush=True)
    if a.only != "minilm":
        gguf(a, texts)
    if a.only != "gguf":
        minilm(a, texts)


if __name__ == "__main__":
    main()
