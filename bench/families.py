"""Each model family at a size CPU users run, superfluid against llama-server on the same GGUF
(issue 50, "6. Figures"): a random-weight model of the family (tests/integration/families.py,
`family_gguf(name, size)`: widths and layers scaled to about --size parameters, Q4_K_M),
served by superfluid (--max-batch 8 --max-context 8192 (--lane-ctx), its defaults otherwise:
no --deterministic, no speculation) and by llama-server (the xllamacpp wheel, in a process of
its own: 8 slots over 8 x 8192 tokens, no speculation, its prompt cache on), the same threads.

    python bench/families.py [--size 1b] [--families llama,qwen3moe,...] [--rounds 3] [--threads 2]
                             [--measure single,lanes,prefill,agent]

Measured, each round on new text, the two servers in turn (reversed every other round):
- single-stream decode tok/s: one greedy completion of --tokens tokens, EOS ignored,
  (tokens - 1) / (last token - first token) as the client sees it;
- 8-lane aggregate decode tok/s: 8 such completions at once (--lane-tokens each), all their
  tokens but each lane's first over the time from the first token of any to the last of any
  (so it counts how the prompts that arrive beside the first one's decode are admitted);
  and the same run's decode alone: each lane's (tokens - 1) / (last - first), summed;
- 4k prefill: seconds for a ~4096-token prompt (nothing of it cached) and one token;
- warm turn 2: an agent-shaped chat: turn 1 a system line and a ~3k-token user message, 64
  tokens generated (EOS ignored); turn 2 that conversation, the reply as the assistant's
  message, and a ~500-token user message: seconds to its first token (max_tokens 1: the whole
  answer). Turn 1's time (a cold 3k prefill and 64 tokens) is printed beside it: a server
  that re-processes the conversation (a hybrid or recurrent model's state cannot be cut
  back to a prefix, a sliding window's cache may not cover it) shows a turn 2 near turn 1.
Printed per family: the medians, superfluid / llama-server of the medians and the geometric
mean of each round's ratio (paired); tok/s: higher is better, seconds: lower is better.
A family llama-server cannot load (xllamacpp's llama.cpp is not llama-cpp-python's) is
printed as such, superfluid's figures alone.

Needs: pip install xllamacpp (bench only)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, Daemon, LlamaServerProcess, document  # noqa: E402

sys.path.insert(0, str(ROOT))
from tests.integration.families import FAMILIES, MADE, family_gguf  # noqa: E402

LANES, LANE_CTX = 8, 8192
WORDS_PER_TOKEN = 1 / 1.04  # SmolLM2's tokenizer over common.document's words
METRICS = (  # key, label, unit (higher better: tok/s)
    ("single", "single-stream decode", "tok/s"),
    ("lanes", f"{LANES}-lane aggregate decode", "tok/s"),
    ("lane_sum", f"{LANES}-lane decode (lane rates summed)", "tok/s"),
    ("prefill", "4k-token prefill", "s"),
    ("turn1", "turn 1 (cold ~3k + 64 out)", "s"),
    ("turn2", "warm turn 2 TTFT (+~500)", "s"),
)


def words(tokens: int) -> int:
    return int(tokens * WORDS_PER_TOKEN)


def stream(url: str, body: dict) -> tuple[float | None, float | None, int]:
    """(first token time, last token time, completion tokens) of one streamed completion."""
    body = {"model": "x", "temperature": 0, "ignore_eos": True, **body, "stream": True,
            "stream_options": {"include_usage": True}}
    first = last = None
    n = chunks = 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                n = d["usage"]["completion_tokens"]
            if any(c.get("text") for c in d.get("choices") or []):
                chunks += 1
                last = time.perf_counter()
                first = first or last
    return first, last, n or chunks


def single(url: str, r: int, tokens: int) -> float:
    first, last, n = stream(url, {"prompt": f"Story {r}: " + document(1000 + r, 12), "max_tokens": tokens})
    return (n - 1) / (last - first) if first and last and last > first and n >= 2 else float("nan")


def lanes(url: str, r: int, tokens: int) -> tuple[float, float]:
    """(all lanes' tokens over the time from the first token of any to the last of any, the sum
    of each lane's own decode rate: the first counts the prompts' admission, the second not)."""
    got: list[tuple[float | None, float | None, int]] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            got.append(stream(url, {"prompt": f"Story {r}.{i}: " + document(2000 + LANES * r + i, 12),
                                    "max_tokens": tokens}))
        except BaseException as e:  # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(LANES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    firsts = [f for f, _, _ in got if f]
    lasts = [s for _, s, _ in got if s]
    made = sum(max(0, n - 1) for _, _, n in got)
    wall = made / (max(lasts) - min(firsts)) if firsts and lasts and max(lasts) > min(firsts) else float("nan")
    rates = [(n - 1) / (s - f) for f, s, n in got if f and s and s > f and n >= 2]
    return wall, sum(rates) if len(rates) == LANES else float("nan")


def prefill(url: str, r: int) -> float:
    t0 = time.perf_counter()
    resp = httpx.post(url + "/v1/completions", timeout=900, json={
        "model": "x", "prompt": document(3000 + r, words(4096)), "max_tokens": 1, "temperature": 0})
    resp.raise_for_status()
    return time.perf_counter() - t0


def chat(url: str, messages: list[dict], tokens: int) -> tuple[float, str]:
    t0 = time.perf_counter()
    resp = httpx.post(url + "/v1/chat/completions", timeout=900, json={
        "model": "x", "messages": messages, "max_tokens": tokens, "temperature": 0, "ignore_eos": True})
    resp.raise_for_status()
    msg = resp.json()["choices"][0]["message"]
    return time.perf_counter() - t0, msg.get("content") or msg.get("reasoning_content") or ""


def agent(url: str, r: int) -> tuple[float, float]:
    """(turn 1 seconds, turn 2 seconds to its first token)."""
    messages = [{"role": "system", "content": "You are a coding agent. Read the file and answer."},
                {"role": "user", "content": "Here is the file:\n" + document(4000 + r, words(3000))}]
    t1, reply = chat(url, messages, 64)
    messages += [{"role": "assistant", "content": reply},
                 {"role": "user", "content": "And this one, what does it change?\n" + document(5000 + r, words(500))}]
    t2, _ = chat(url, messages, 1)
    return t1, t2


def run_family(name: str, a) -> tuple[dict[str, dict[str, list[float]]], str, str]:
    """({server: {metric: per-round values}}, the model's line, why llama-server is missing or "")."""
    t0 = time.monotonic()
    path = family_gguf(name, a.size)
    size_mb = Path(path).stat().st_size / 2**20
    servers: dict[str, object] = {}
    urls: dict[str, str] = {}
    missing = ""
    try:
        servers["superfluid"] = d = Daemon(path, threads=a.threads, max_context=a.lane_ctx, max_batch=LANES)
        urls["superfluid"] = d.url
        try:
            servers["llama-server"] = p = LlamaServerProcess(path, a.threads, LANES * a.lane_ctx, parallel=LANES)
            urls["llama-server"] = p.url
        except Exception as e:  # the result for this family
            missing = f"llama-server could not load it: {e}"
        values: dict[str, dict[str, list[float]]] = {s: {m: [] for m, _, _ in METRICS} for s in urls}
        for url in urls.values():  # warm: loaded, first request served
            stream(url, {"prompt": "Hello", "max_tokens": 4})
        for r in range(a.rounds):
            for key in a.measure:
                for s in (list(urls) if r % 2 == 0 else list(urls)[::-1]):
                    url, v = urls[s], values[s]
                    try:
                        if key == "single":
                            v["single"].append(single(url, r, a.tokens))
                        elif key == "lanes":
                            wall, each = lanes(url, r, a.lane_tokens)
                            v["lanes"].append(wall)
                            v["lane_sum"].append(each)
                        elif key == "prefill":
                            v["prefill"].append(prefill(url, r))
                        else:
                            t1, t2 = agent(url, r)
                            v["turn1"].append(t1)
                            v["turn2"].append(t2)
                    except Exception as e:  # printed, the figure left out
                        print(f"  {name} round {r} {key} on {s}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        for m in {"agent": ("turn1", "turn2"), "lanes": ("lanes", "lane_sum")}.get(key, (key,)):
                            v[m].append(float("nan"))
            print(f"  {name}: round {r + 1}/{a.rounds} done at {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        for srv in servers.values():
            srv.stop()  # type: ignore[attr-defined]
    f = FAMILIES[name]
    line = (f"{name} ({f.kind}, {a.size}, Q4_K_M, {size_mb:.0f} MiB, {Path(path).name}"
            f"{f', made in {MADE[name]:.0f} s' if name in MADE else ''})")
    return values, line, missing


def med(xs: list[float]) -> float:
    ok = [x for x in xs if x == x]
    return statistics.median(ok) if ok else float("nan")


def table(values: dict[str, dict[str, list[float]]], line: str, missing: str, a) -> None:
    print(f"\n{line}: median of {a.rounds} round(s), {a.threads} threads")
    print(f"  {'':42s} {'superfluid':>11s} {'llama-server':>13s} {'sf/ls':>7s} {'paired':>7s}")
    for key, label, unit in METRICS:
        if not values["superfluid"][key]:
            continue  # not measured (--measure)
        sf = med(values["superfluid"][key])
        if "llama-server" in values:
            ls = med(values["llama-server"][key])
            pairs = [x / y for x, y in zip(values["superfluid"][key], values["llama-server"][key], strict=True)
                     if x == x and y == y and y > 0 and x > 0]
            paired = statistics.geometric_mean(pairs) if pairs else float("nan")
            print(f"  {label + ' ' + unit:42s} {sf:11.2f} {ls:13.2f} {sf / ls:6.2f}x {paired:6.2f}x")
        else:
            print(f"  {label + ' ' + unit:42s} {sf:11.2f} {'-':>13s}")
    if missing:
        print(f"  {missing}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1b", help="parameters of each model: 1b (default), 300m, ...")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated (default: all eight)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="single-stream tokens (default 128)")
    ap.add_argument("--lane-tokens", type=int, default=64, help="each of the 8 lanes' tokens (default 64)")
    ap.add_argument("--lane-ctx", type=int, default=LANE_CTX,
                    help="each lane's window on both servers (default 8192; both run at once: at 1b two "
                         "8 x 8192 caches did not fit 24 GiB, and the kernel killed a worker)")
    ap.add_argument("--measure", default="single,lanes,prefill,agent",
                    help="which figures, comma-separated (default: all four; agent gives both turns)")
    a = ap.parse_args()
    a.measure = a.measure.split(",")
    if not set(a.measure) <= {"single", "lanes", "prefill", "agent"}:
        ap.error("--measure: of single, lanes, prefill, agent")
    names = a.families.split(",")
    if not set(names) <= set(FAMILIES):
        ap.error(f"--families: of {', '.join(FAMILIES)}")
    results = []
    for name in names:
        try:
            results.append(run_family(name, a))
        except Exception as e:  # the next family still runs
            print(f"{name}: failed: {type(e).__name__}: {str(e)[:500]}", flush=True)
        else:
            table(*results[-1], a)  # as soon as it is known
    print("\n=== all families ===")
    for res in results:
        table(*res, a)


if __name__ == "__main__":
    main()
