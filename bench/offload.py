"""Decode and prefill at --gpu-layers 0, half and all, on whatever offload device the build sees
(issue 51): superfluid serving the same GGUF each way, and llama-server (xllamacpp) at all
layers when it has the same device (its wheel is CPU-only here: then its CPU figures).

    python bench/offload.py [--model GGUF] [--rounds 3] [--threads 2] [--env K=V ...] [--llama-server BIN]
                            [--tokens 128] [--prefill-tokens 2048]

The model: --model, else the embedded SmolLM2-135M. `--env GGML_VK_VISIBLE_DEVICES=0` (and
GGML_VK_DISABLE_F16=1) puts Mesa's lavapipe in reach of a Vulkan build (docs/gpu.md): lavapipe
runs on the CPU, so there is no speed target there; on a real GPU the target is >= 1.0x
llama-server. Measured each round: single-stream decode tok/s (--tokens, 128) and a ~2k-token
prefill (seconds; --prefill-tokens: lavapipe takes minutes for 2k), the medians printed per
layer count. With --llama-server (a llama-server binary
built with the same backend: scripts/gpu-check.sh builds one), the same at every layer on its
device, and the ratios."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, Daemon, document  # noqa: E402
from families import single, words  # noqa: E402

import httpx  # noqa: E402

sys.path.insert(0, str(ROOT))
from superfluid.runtime.registry import embedded_model  # noqa: E402


def prefill(url: str, r: int, tokens: int = 2048) -> float:
    import time
    t0 = time.perf_counter()
    body = {"model": "x", "prompt": document(7000 + r, words(tokens)), "max_tokens": 1, "temperature": 0}
    httpx.post(url + "/v1/completions", timeout=900, json=body).raise_for_status()
    return time.perf_counter() - t0


def layer_count(path: str) -> int:
    from superfluid.codec.tokenizer import Tokenizer
    return Tokenizer(path).shape.n_layer + 1  # and the output layer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="for the daemon and its worker")
    ap.add_argument("--llama-server", default="", metavar="BIN", help="a llama-server binary to compare with")
    ap.add_argument("--tokens", type=int, default=128, help="single-stream decode tokens")
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    a = ap.parse_args()
    path = a.model or str(embedded_model().path)
    env = dict(kv.split("=", 1) for kv in a.env)
    whole = layer_count(path)
    print(f"{Path(path).name}: {whole} layers (with the output), {a.threads} threads, env {env or '-'}")
    print(f"{'--gpu-layers':>14} {'device line':<60} {'decode tok/s':>13} {f'{a.prefill_tokens} prefill s':>13}")
    for layers in (0, whole // 2, whole):
        d = Daemon(path, "--gpu-layers", str(layers), max_context=4096, max_batch=4, threads=a.threads, env=env)
        try:
            where = d.health()["models"]
            device = next(iter(where.values())).get("device", {})
            dec = [single(d.url, r, a.tokens) for r in range(a.rounds)]
            pre = [prefill(d.url, r, a.prefill_tokens) for r in range(a.rounds)]
        finally:
            d.stop()
        said = f"{'+'.join(device.get('devices', []))} {device.get('layers', 0)}/{device.get('of', whole)}"
        print(f"{layers:>14} {said:<60} {statistics.median(dec):>13.2f} {statistics.median(pre):>13.2f}")
    if a.llama_server:
        ls_dec, ls_pre = peer(a.llama_server, path, a.rounds, a.threads, env, a.tokens, a.prefill_tokens)
        print(f"{'llama-server':>14} {'-ngl 999':<60} {ls_dec:>13.2f} {ls_pre:>13.2f}")
        print(f"{'sf/ls':>14} {'(all layers; decode: higher is better, prefill: lower)':<60} "
              f"{statistics.median(dec) / ls_dec:>12.2f}x {statistics.median(pre) / ls_pre:>12.2f}x")


def peer(binary: str, path: str, rounds: int, threads: int, env: dict, tokens: int = 128,
         prefill_tokens: int = 2048) -> tuple[float, float]:
    """(decode tok/s, prefill s) of a llama-server binary with every layer on its device."""
    import os
    import subprocess
    import time
    from common import free_port
    port = free_port()
    proc = subprocess.Popen([binary, "-m", path, "-ngl", "999", "-c", str(4 * 4096), "-np", "4", "-t", str(threads),
                             "--port", str(port), "--host", "127.0.0.1"], env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        dec = [single(url, r, tokens) for r in range(rounds)]
        pre = [prefill(url, r, prefill_tokens) for r in range(rounds)]
        return statistics.median(dec), statistics.median(pre)
    finally:
        proc.kill()
        proc.wait(20)


if __name__ == "__main__":
    main()
