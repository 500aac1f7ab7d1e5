"""Durability under fire (issue 33): streams and a log writer run while the daemon is killed
with SIGKILL at random moments and restarted on the same home, again and again.

- `streams` greedy generations run at once, streamed, a different prompt each, over three
  APIs in turn: OpenAI chat completions, Anthropic Messages and Responses. A stream cut by
  a kill reconnects to `/v1/sessions/{id}/resume` with the Last-Event-ID it last saw, on the
  restarted daemon, as often as it takes, and reads on in its own API's events; once it
  ends, what it received must be the uncut text (from a reference run before any kill),
  every token exactly once. Then it starts the next.
- A writer appends native session messages; each acknowledged one must be in the log
  exactly once after all the kills.
- Each restart's time (the process started to /health answering) is kept: it must not
  grow with the kills.

`run()` is used by the suite's short version (tests/integration/test_kill_loop.py) and
bench/kill_loop.py (100 kills)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import httpx

from superfluid.client import iter_sse

from .daemon import Daemon

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["Write a long story about a lighthouse keeper and a storm.",
           "Describe, step by step, how bread is baked in a village oven.",
           "Tell the history of a small river town over three centuries.",
           "Explain how a sailing ship crosses an ocean, in detail.",
           "Write a long letter from a gardener to her sister about the seasons.",
           "Describe a journey by train across a snowy country.",
           "Tell a fable about a fox, a crow and a clever farmer.",
           "Write the diary of a mountain guide during one long summer."]


APIS = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


def body(i: int, budget: int) -> dict:
    """Stream i's request: prompt i, on API i % 3, streamed."""
    prompt, path = PROMPTS[i % len(PROMPTS)], APIS[i % len(APIS)]
    if path == "/v1/responses":
        return {"model": MODEL, "max_output_tokens": budget, "temperature": 0, "input": prompt, "stream": True}
    return {"model": MODEL, "max_tokens": budget, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": prompt}]}


def piece(data) -> tuple[str | None, bool]:
    """(text, ended) of one SSE event's data in any of the three APIs' formats; a failure
    raises."""
    if data == "[DONE]":
        return None, True
    if not isinstance(data, dict) or "error" in data or data.get("type") in ("error", "response.failed"):
        raise RuntimeError(f"stream error: {data}")
    kind = data.get("type")
    if kind == "content_block_delta":
        return data["delta"].get("text"), False
    if kind == "response.output_text.delta":
        return data["delta"], False
    if kind in ("message_stop", "response.completed", "response.incomplete"):
        return None, True
    if "choices" in data and data["choices"]:
        return data["choices"][0]["delta"].get("content"), False
    return None, False


class Loop:
    def __init__(self, home: str, streams: int, budget: int, daemon_args: tuple[str, ...] = ()):
        self.home, self.budget, self.args = home, budget, daemon_args
        self.up = threading.Event()
        self.done = False
        self.lock = threading.Lock()
        self.checked = 0  # tokens (content pieces) received and checked against the uncut text
        self.finished = 0  # generations checked whole
        self.by_api: dict[str, int] = {}  # of those, per API
        self.resumed = 0  # reconnections that resumed a cut stream
        self.mismatches: list[dict] = []
        self.acked: list[str] = []  # writer messages the daemon acknowledged
        self.restarts: list[float] = []
        self.streams = streams
        self.refs: list[str] = []
        self.d: Daemon | None = None

    # -- the daemon ----------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.monotonic()
        self.d = Daemon(*self.args, home=self.home, max_batch=max(1, self.streams))
        self.restarts.append(time.monotonic() - t0)
        self.up.set()

    def kill(self) -> None:
        self.up.clear()
        assert self.d is not None
        os.kill(self.d.proc.pid, signal.SIGKILL)
        self.d.proc.wait(30)

    def url(self) -> str:
        self.up.wait()
        assert self.d is not None
        return self.d.url

    # -- the clients ---------------------------------------------------------------------
    def references(self) -> None:
        """The uncut texts, from this daemon before any kill (the same settings, other sessions)."""
        for i in range(self.streams):
            text = self._one(i)
            assert text, f"stream {i}'s reference run gave nothing"
            self.refs.append(text)

    def stream(self, i: int) -> None:
        while not self.done:
            text = self._one(i)
            if text is None:
                continue
            with self.lock:
                self.finished += 1
                self.by_api[APIS[i % len(APIS)]] = self.by_api.get(APIS[i % len(APIS)], 0) + 1
                if text != self.refs[i]:
                    self.mismatches.append({"stream": i, "api": APIS[i % len(APIS)], "got": text,
                                            "want": self.refs[i]})

    def _one(self, k: int) -> str | None:
        """One generation to its end across kills; None when it was cut before its session
        was known or any token came (a new request starts; nothing was seen)."""
        seen: list[str] = []
        sid, last = None, None
        while True:
            url = self.url()
            try:
                if sid is None:
                    cm = httpx.stream("POST", url + APIS[k % len(APIS)], json=body(k, self.budget), timeout=300)
                else:
                    cm = httpx.stream("GET", f"{url}/v1/sessions/{sid}/resume", headers={"Last-Event-ID": last},
                                      timeout=300)
                with cm as r:
                    if r.status_code != 200:
                        r.read()
                        raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
                    sid = sid or r.headers["x-superfluid-session"]
                    for eid, data in iter_sse(r.iter_lines()):
                        text, ended = piece(data)
                        if ended:
                            with self.lock:
                                self.checked += len(seen)
                            return "".join(seen)
                        if text:
                            seen.append(text)
                        if eid is not None:
                            last = eid
            except (httpx.HTTPError, KeyError):  # the daemon died under it: wait, then resume
                if self.done:
                    return None
                if sid is None or last is None:
                    return None
                self.up.wait()
                with self.lock:
                    self.resumed += 1

    def writer(self) -> None:
        """Native appends to one session, one after another; acknowledged: a 2xx was seen."""
        n = 0
        sid = None
        while not self.done:
            url = self.url()
            try:
                if sid is None:
                    r = httpx.post(url + "/v1/sessions", json={"model": MODEL}, timeout=30)
                    r.raise_for_status()
                    sid = r.json()["id"]
                note = f"note {n}"
                n += 1  # never sent twice: a note whose answer a kill cut may be in the log (not acknowledged)
                r = httpx.post(f"{url}/v1/sessions/{sid}/messages", json={"role": "user", "content": note},
                               timeout=30)
                if r.status_code < 300:
                    with self.lock:
                        self.acked.append(f"{sid}|{note}")
                time.sleep(0.05)
            except httpx.HTTPError:
                self.up.wait()

    def check_log(self) -> list[str]:
        """Acknowledged appends missing from the log, or in it more than once."""
        url, bad = self.url(), []
        by_session: dict[str, list[str]] = {}
        for a in self.acked:
            sid, note = a.split("|", 1)
            by_session.setdefault(sid, []).append(note)
        for sid, notes in by_session.items():
            texts, after = [], -1
            while True:
                page = httpx.get(f"{url}/v1/sessions/{sid}/events", params={"after": after, "limit": 10000},
                                 timeout=60).json()
                texts += [e.get("text") for e in page["data"] if e["type"] == "message"]
                if len(page["data"]) < 10000:
                    break
                after = page["next"]
            bad += [f"{sid}: {n} x{texts.count(n)}" for n in notes if texts.count(n) != 1]
        return bad


def run(home: str, *, kills: int, streams: int = 4, budget: int = 48, seed: int = 1,
        gap: tuple[float, float] = (0.5, 2.5), daemon_args: tuple[str, ...] = ()) -> dict:
    """Kill the daemon `kills` times at random moments `gap` seconds apart; the summary."""
    rng = random.Random(seed)
    loop = Loop(home, streams, budget, daemon_args)
    loop.start()
    loop.references()
    threads = [threading.Thread(target=loop.stream, args=(i,), daemon=True) for i in range(streams)]
    threads.append(threading.Thread(target=loop.writer, daemon=True))
    for t in threads:
        t.start()
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(*gap))
            loop.kill()
            loop.start()
        time.sleep(gap[1])  # the last restart's streams get going
        loop.done = True
        for t in threads:
            t.join(300)
        bad_log = loop.check_log()
    finally:
        loop.done = True
        if loop.d is not None:
            loop.d.stop()
    kv = os.path.join(home, "kv")
    tmp = [f for _, _, fs in os.walk(kv) for f in fs if f.endswith(".tmp")] if os.path.isdir(kv) else []
    return {"kills": kills, "streams": streams, "finished": loop.finished, "finished_by_api": loop.by_api,
            "tokens_checked": loop.checked,
            "resumed": loop.resumed, "mismatches": loop.mismatches, "acked_appends": len(loop.acked),
            "log_errors": bad_log, "restart_s": [round(x, 2) for x in loop.restarts], "tmp_files": tmp}
