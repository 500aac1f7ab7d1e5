"""Soak: 16 clients for N minutes on every API (OpenAI chat streamed and whole, Anthropic
streamed, Ollama chat, Responses streamed, tool turns), some interactive, with random
disconnects and Last-Event-ID resumes, and N hostile clients mixed in (--hostile, issue 54).
Then it checks:

- every session's log holds exactly what its clients received (a resumed stream's text
  joined to what was seen before the cut), nothing lost or twice;
- the daemon's RSS and open file descriptors after the first minute (slope per minute);
- p99 time to first token of the interactive class.

The hostile clients send, in a loop for the whole run, what issue 54's findings describe and
other bad input: hosted tools whose `type` holds non-Latin-1 characters and newlines (a 200
whose x-superfluid-dropped-tools header is printable ASCII), chat markers in tool-call names,
arguments, ids and tool descriptions (a 200 or a typed 400), JSON 300 levels deep in tool-call
arguments, tool schemas and /completion prompts (typed 400s), bodies over --max-body (413),
trailing-slash and made-up paths (307/404/405), foreign Host headers and repeated headers
(typed 4xx), garbage bodies and wrong types on every generating API (typed 400s), random
mutations of legal bodies (a 200 or a typed 4xx), and streams hung up at once (the generation
is cut). Each answer is counted per kind; a 5xx, a timeout, a connection closed without an
answer, or a legal request's 200 that is not right (the header, an unfinished stream, a
generation still running after its client left) is a failure, listed at the end with its
request and answer; a status the kind does not expect or an untyped 4xx is listed apart as
unexpected (a finding, not a failure). The run also asserts: the worker's pid never changed
(/health, every minute), no client saw a 5xx, nothing runs or waits once the clients stop (a
hung-up stream left no generation behind), no /metrics series names a made-up path, and the
daemon logged no unhandled exception (its stdout and stderr are read into --daemon-log:
a pipe left unread fills, and uvicorn writes its traceback of an unhandled exception to it
from the event loop). The exit status is 1 when a check fails.

    python bench/soak.py [--minutes 10] [--clients 16] [--hostile 4]"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter

import httpx
import orjson
from common import Daemon
from hostile import hostile_client
from hostile_core import MARK, MODEL, Hostile, excerpt

from superfluid.client import iter_sse

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a code up", "parameters": {
    "type": "object", "properties": {"account": {"type": "string", "maxLength": 12}}, "required": ["account"]}}}


def proc_stats(pid: int) -> tuple[int, int]:
    """(RSS bytes, open fds) of the daemon and its children."""
    rss, fds = 0, 0
    try:
        pids = [pid] + [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        pids = [pid]
    for p in pids:
        try:
            rss += int(open(f"/proc/{p}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            pass
    return rss, fds


class Tally:
    def __init__(self) -> None:
        self.ok = self.errors = self.resumed = self.mismatched = 0
        self.ttft: list[float] = []
        self.checks: list[tuple[str, str]] = []  # (session, text the client got)
        self.status: Counter = Counter()  # every answer's status
        self.failures: list[str] = []  # each error: what was asked, what came back

    def answered(self, what: str, r: httpx.Response, body: object) -> bool:
        """Counts `r`'s status; a status other than 200 is an error, listed. True on a 200."""
        self.status[r.status_code] += 1
        if r.status_code == 200:
            return True
        self.errors += 1
        self.failures.append(f"ordinary {what}: {r.status_code} {excerpt(r.content)}; request {excerpt(body)}")
        return False


async def chat_stream(c: httpx.AsyncClient, t: Tally, rng: random.Random, interactive: bool) -> None:
    body = {"model": MODEL, "max_tokens": rng.randint(4, 24), "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": f"Tell me about the number {rng.randint(0, 999)}."}]}
    headers = {"x-superfluid-qos": "interactive"} if interactive else {}
    cut = rng.random() < 0.3
    seen, last, sid, t0, first = "", None, None, time.perf_counter(), None
    async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
        if not t.answered("chat stream", r, body):
            return
        sid = r.headers.get("x-superfluid-session")
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                last = line[4:]
            if line.startswith("data: {"):
                d = orjson.loads(line[6:])
                piece = d["choices"][0]["delta"].get("content") if d["choices"] else None
                if piece:
                    first = first or time.perf_counter()
                    seen += piece
                if cut and piece and rng.random() < 0.3 and last:
                    break
        else:
            cut = False
    if interactive and first:
        t.ttft.append(first - t0)
    if cut and last and sid:
        t.resumed += 1
        async with c.stream("GET", f"/v1/sessions/{sid}/resume", headers={"Last-Event-ID": last}) as r:
            if r.status_code != 200:
                await r.aread()
            if not t.answered(f"resume of {sid} from {last}", r, {}):
                return
            for _, d in iter_sse([ln async for ln in r.aiter_lines()]):
                if isinstance(d, dict) and d.get("choices"):
                    seen += d["choices"][0]["delta"].get("content") or ""
    if sid:
        t.checks.append((sid, seen))
    t.ok += 1


async def other_api(c: httpx.AsyncClient, t: Tally, rng: random.Random) -> None:
    kind = rng.choice(["anthropic", "ollama", "responses", "tool", "whole"])
    msgs = [{"role": "user", "content": f"Say something about {rng.choice(['tea', 'rain', 'maps'])}."}]
    if kind == "anthropic":
        path, body = "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": msgs, "stream": True}
    elif kind == "ollama":
        path, body = "/api/chat", {"model": MODEL, "messages": msgs, "options": {"num_predict": 8}}
    elif kind == "responses":
        path, body = "/v1/responses", {"model": MODEL, "input": msgs[0]["content"], "max_output_tokens": 8,
                                       "stream": True}
    elif kind == "tool":
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": msgs, "tools": [TOOL],
                                              "tool_choice": "required", "max_tokens": 40}
    else:
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 8}
    r = await c.post(path, json=body)
    if t.answered(f"{kind} {path}", r, body):
        t.ok += 1


async def client(url: str, t: Tally, seed: int, until: float) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        while time.monotonic() < until:
            try:
                if rng.random() < 0.5:
                    await chat_stream(c, t, rng, interactive=seed % 4 == 0)
                else:
                    await other_api(c, t, rng)
            except httpx.HTTPError as e:
                t.errors += 1
                t.failures.append(f"ordinary client {seed}: {type(e).__name__}: {e}")


# -- hostile clients (issue 54) ------------------------------------------------------------

async def worker_pid(c: httpx.AsyncClient) -> int | None:
    try:
        return (await c.get("/health", timeout=30)).json()["models"][MODEL]["worker_pid"]
    except (httpx.HTTPError, KeyError, ValueError) as e:
        print(f"/health unreadable: {type(e).__name__}: {e}")
        return None


async def metric_series(c: httpx.AsyncClient) -> list[str] | None:
    """/metrics' series (its lines that are not comments); None when it did not answer."""
    try:
        text = (await c.get("/metrics", timeout=30)).text
    except httpx.HTTPError as e:
        print(f"/metrics unreadable: {type(e).__name__}: {e}")
        return None
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


class DaemonLog:
    """The daemon's stdout and stderr, read by a thread into `path`. Unread, the pipe
    fills, and a line written to it straight from the event loop (uvicorn's own record of an
    unhandled exception, with its traceback) then blocks the daemon for good. Counts the
    unhandled exceptions, by their last line."""

    def __init__(self, d: Daemon, path: str) -> None:
        self.path = path
        self.unhandled = 0  # uvicorn's "Exception in ASGI application"
        self.raised: Counter = Counter()  # each traceback's exception line
        threading.Thread(target=self._read, args=(d.proc.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        with open(self.path, "w") as f:
            inside = False
            for line in stream:
                f.write(line)
                self.unhandled += "Exception in ASGI application" in line
                if line.startswith("Traceback (most recent call last)"):
                    inside = True
                elif inside and line.strip() and not line[0].isspace():
                    inside = False
                    self.raised[line.strip()[:200]] += 1


async def verify(url: str, t: Tally) -> None:
    """Each checked session's log content equals what its client got."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        for sid, got in t.checks:
            evs = (await c.get(f"/v1/sessions/{sid}/events", params={"limit": 10000})).json()["data"]
            start = max(i for i, e in enumerate(evs) if e["type"] == "generation_prompt")
            logged = "".join(e["text"] for e in evs[start:] if e["type"] == "generated")
            if logged != got:
                t.mismatched += 1
                print(f"session {sid}: the log holds {logged!r}, its client got {got!r}; events "
                      f"{[(e['type'], e.get('finish')) for e in evs[start:]]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--hostile", type=int, default=4, help="hostile clients mixed in (issue 54); 0: none")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--daemon-log", default=os.path.join(tempfile.gettempdir(), f"soak-daemon-{os.getpid()}.log"),
                    help="where the daemon's output goes (kept after the run)")
    args = ap.parse_args()
    d = Daemon(max_context=1024, threads=args.threads)
    daemon_log = DaemonLog(d, args.daemon_log)
    t, h = Tally(), Hostile()
    samples: list[tuple[float, int, int]] = []
    pids: list[tuple[float, int | None]] = []  # (seconds in, the worker's pid)
    series: dict[str, int] = {}  # /metrics series: at the start, after a minute, at the end
    end: dict = {}
    try:
        t0 = time.monotonic()
        until = t0 + args.minutes * 60

        async def run() -> None:
            async with httpx.AsyncClient(base_url=d.url, timeout=60) as c:
                pids.append((0.0, await worker_pid(c)))
                series["at the start"] = len(await metric_series(c) or [])
                tasks = [asyncio.create_task(client(d.url, t, i, until)) for i in range(args.clients)]
                tasks += [asyncio.create_task(hostile_client(d.url, d.port, h, i, until)) for i in range(args.hostile)]
                minute = t0 + 60
                while not all(x.done() for x in tasks):
                    samples.append((time.monotonic() - t0, *proc_stats(d.proc.pid)))
                    if time.monotonic() >= minute:
                        minute += 60
                        pids.append((time.monotonic() - t0, await worker_pid(c)))
                        if "after a minute" not in series and (lines := await metric_series(c)) is not None:
                            series["after a minute"] = len(lines)
                    await asyncio.sleep(5)
                await asyncio.gather(*tasks)
                for _ in range(150):  # a hung-up stream's generation must be gone: nothing runs or waits
                    try:
                        row = (await c.get("/health", timeout=30)).json()["models"][MODEL]
                    except (httpx.HTTPError, KeyError, ValueError) as e:
                        row = {"running": f"unknown ({type(e).__name__})", "waiting": "unknown"}
                        break
                    if row["running"] == 0 and row["waiting"] == 0:
                        break
                    await asyncio.sleep(0.1)
                end.update(running=row["running"], waiting=row["waiting"])
                pids.append((time.monotonic() - t0, await worker_pid(c)))
                lines = await metric_series(c)
                if lines is not None:
                    series["at the end"] = len(lines)
                    end["raw"] = [ln for ln in lines if MARK in ln]
                    end["paths"] = {ln.split('path="', 1)[1].split('"', 1)[0] for ln in lines if 'path="' in ln}
                    end["respawns"] = sum(float(ln.rsplit(" ", 1)[1]) for ln in lines
                                          if ln.startswith("superfluid_worker_respawns_total"))
            await verify(d.url, t)
        asyncio.run(run())
    finally:
        d.stop()
    late = [s for s in samples if s[0] >= 60] or samples
    per_min = lambda k: (late[-1][k] - late[0][k]) / max(1e-9, (late[-1][0] - late[0][0]) / 60)  # noqa: E731
    ttft = sorted(t.ttft)
    p99 = ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] if ttft else float("nan")
    print(f"requests ok {t.ok}, errors {t.errors}, streams resumed {t.resumed}, "
          f"sessions checked {len(t.checks)}, log != received: {t.mismatched}")
    print(f"RSS {late[-1][1] / 2**20:.0f} MiB, slope {per_min(1) / 2**20:+.1f} MiB/min; "
          f"fds {late[-1][2]}, slope {per_min(2):+.1f}/min (after the first minute)")
    print(f"interactive TTFT p50 {statistics.median(ttft) if ttft else float('nan'):.2f} s, p99 {p99:.2f} s "
          f"({len(ttft)} chats)")
    for line in t.failures[:20]:
        print("  " + line)

    five = lambda counts: sum(n for s, n in counts.items() if isinstance(s, int) and s >= 500)  # noqa: E731
    hostile_5xx = sum(five(s) for s in h.statuses.values())
    if args.hostile:
        total = sum(sum(s.values()) for s in h.statuses.values())
        print(f"\nhostile clients {args.hostile}: {total} requests, {len(h.failures)} failures")
        print(f"  {'kind':<52} {'requests':>8} {'slowest':>8}  statuses")
        for kind in sorted(h.statuses):
            s = h.statuses[kind]
            shown = ", ".join(f"{k} x{n}" for k, n in sorted(s.items(), key=lambda kv: str(kv[0])))
            print(f"  {kind:<52} {sum(s.values()):>8} {h.slowest[kind]:>7.2f}s  {shown}")
        failed = Counter(kind for kind, _ in h.failures)
        for kind, n in failed.most_common():  # each kind's first three in full
            print(f"\n  {n} failures of {kind}, the first:")
            for line in [why for k, why in h.failures if k == kind][:3]:
                print("    " + line)
        for kind, n in Counter(kind for kind, _ in h.odd).most_common():  # not faults, but not what was expected
            print(f"\n  {n} unexpected answers (no 5xx) to {kind}, the first:")
            for line in [why for k, why in h.odd if k == kind][:2]:
                print("    " + line)
    changed = [(round(s), p) for s, p in pids if p != pids[0][1]]
    checks = [
        (f"the worker's pid never changed ({pids[0][1]}, read {len(pids)} times; respawns "
         f"{end.get('respawns', '?')})", pids[0][1] is not None and not changed and end.get("respawns") == 0),
        (f"no 5xx from any client (ordinary {five(t.status)}, hostile {hostile_5xx})",
         five(t.status) == 0 and hostile_5xx == 0),
        (f"every ordinary request answered 200 ({t.errors} errors)", t.errors == 0),
        (f"every session's log holds what its clients received ({len(t.checks)} sessions, "
         f"{t.mismatched} differ)", t.mismatched == 0 and bool(t.checks)),
        (f"nothing running or waiting once the clients stopped (running {end.get('running')}, "
         f"waiting {end.get('waiting')})", end.get("running") == 0 and end.get("waiting") == 0),
        (f"the daemon logged no unhandled exception ({daemon_log.unhandled}; its output: {daemon_log.path})",
         daemon_log.unhandled == 0),
    ]
    if args.hostile:
        checks += [
            (f"every hostile request answered, no 5xx, every legal one a correct 200 ({len(h.failures)} failures)",
             not h.failures),
            (f"/metrics grew no series per made-up path ({len(h.paths)} made-up paths sent; series "
             + ", ".join(f"{n} {k}" for k, n in series.items())
             + f"; {len(end.get('paths', ()))} path labels; {len(end.get('raw', ()))} series naming a made-up path)",
             series.get("at the end") is not None and not end.get("raw")),
        ]
    if changed:
        print(f"the worker's pid changed or /health did not answer: {changed} (at the start {pids[0][1]})")
    for line, n in daemon_log.raised.most_common(5):
        print(f"  the daemon's log: {n} tracebacks ending {line!r}")
    for line in end.get("raw", [])[:10]:
        print(f"  a series naming a made-up path: {line[:300]}")
    print()
    for what, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    if h.odd:
        print(f"NOTE  {len(h.odd)} hostile answers outside their kind's typed 4xx (listed above; not counted as "
              "failures)")
    if not all(ok for _, ok in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
