"""Helpers shared by the benchmarks: start servers, stream a chat, read metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.daemon import Daemon, free_port  # noqa: E402,F401

WORDS = ("river stone lantern harbor meadow copper violet thunder orchard canyon velvet ember glacier "
         "falcon prairie willow marble saffron tundra beacon").split()


def document(i: int, words: int) -> str:
    """A distinct, deterministic text of about `words` words."""
    out, x = [], 1_000_003 * (i + 1)
    for _ in range(words):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(WORDS[(x >> 33) % len(WORDS)])
    return " ".join(out)


async def stream_ttft(client: httpx.AsyncClient, body: dict, headers: dict | None = None) -> tuple[float, str]:
    """(seconds to the first content token, whole text)."""
    t0 = time.perf_counter()
    ttft, text = None, ""
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                             headers=headers or {}) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            for c in json.loads(line[6:]).get("choices", []):
                piece = (c.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
    return (ttft if ttft is not None else float("nan")), text


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


class Peer:
    """llama-cpp-python's own OpenAI server (needs: pip install 'llama-cpp-python[server]')."""

    def __init__(self, model: str, n_ctx: int, threads: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_ctx", str(n_ctx),
             "--n_threads", str(threads), "--n_threads_batch", str(threads), "--host", "127.0.0.1",
             "--port", str(self.port), "--model_alias", "peer"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("llama_cpp.server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class LlamaServer:
    """llama-server from the xllamacpp wheel (bench only: pip install xllamacpp), serving in
    this process's threads until it exits. `configure(params, xllamacpp)` sets the rest
    (embeddings, speculation, slots)."""

    def __init__(self, model: str, threads: int, n_ctx: int, configure=None):
        import xllamacpp as x

        from superfluid.runtime.llamacpp_params import extra_buffers_safe

        p = x.CommonParams()
        p.model.path = model
        p.n_parallel = 1
        p.n_ctx = n_ctx
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads
        p.no_extra_bufts = not extra_buffers_safe()  # its AMX kernels fault where ours would
        p.use_jinja = True
        p.hostnames = ["127.0.0.1"]
        p.port = free_port()
        if configure is not None:
            configure(p, x)
        self.server = x.Server(p)
        self.url = f"http://127.0.0.1:{p.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        raise RuntimeError("llama-server did not start")



class LlamaServerProcess:
    """llama-server (xllamacpp) in a process of its own, for benchmarks that also load
    llama-cpp-python in this one (two ggml builds in one process would share symbols):
    `parallel` slots over n_ctx tokens in all, `threads` (0: llama.cpp's own default)."""

    def __init__(self, model: str, threads: int, n_ctx: int, parallel: int = 1, conf: str = ""):
        """`conf`: more lines of the configure function (indented 4, `p` the params, `x` the module)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        code = (f"import sys, time; sys.path.insert(0, {str(ROOT / 'bench')!r}); from common import LlamaServer\n"
                f"def conf(p, x):\n    p.n_parallel = {parallel}; p.port = {self.port}\n"
                f"    if {threads} <= 0: p.cpuparams.n_threads = p.cpuparams_batch.n_threads = -1\n{conf}"
                f"s = LlamaServer({model!r}, {max(threads, 1)}, {n_ctx}, conf)\nprint('ready', flush=True)\n"
                "time.sleep(1e9)")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        if self.proc.stdout is None or "ready" not in self.proc.stdout.readline():
            self.stop()
            raise RuntimeError("llama-server did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(20)
