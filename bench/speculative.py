"""Single-stream decode speed with and without speculative decoding, same run, same model,
same threads, greedy:

- agent replay: a coding agent's session replayed turn by turn as completions over its
  transcript, the model's own outputs of the earlier turns in it: a plan, a read_file tool
  call (a fixed JSON schema), the file read and written back with one function renamed, a
  write_file call and the plan restated. Each round replays it for another file (other
  names, the same shape), as an agent's next task or a sub-agent's would be;
- edit: a 300-line Python file, "return it with one function renamed" (the output mostly
  repeats the input: prompt-lookup drafts are accepted);
- free chat: open questions, nothing to copy (speculation must not slow them down).

Compared: superfluid --speculative off, ngram (prompt lookup), suffix (suffix trees over the
lane's context and earlier outputs, runtime/suffix.py), with --draft also draft (a draft
model: the embedded model cut to its first --draft-layers layers, tests/integration/draft_gguf.py,
or --draft-model GGUF), and llama-server (the xllamacpp wheel's embedded server) with its
n-gram speculation (ngram-simple) at its defaults.
Decode tok/s = (completion tokens - 1) / (last token time - first token time), the median
over a workload's items (an agent task: all its turns' tokens over all their decode time; an
edit; each free-chat question) of --rounds. Each round asks new questions and edits and
replays the task for another file: an answer a server gave before would otherwise be drafted
whole from its suffix tree. The servers take turns on each item, in reversed order every
other item, so that a noisy moment of this shared machine hits them alike (a round's rate
moved 92-129 tok/s on one server); `paired` is the geometric mean of each item's ratio to
the same item without speculation.

    python bench/speculative.py [--rounds 3] [--threads 1] [--tokens 256] [--works agent,edit,free]
                                [--draft [--draft-layers 4 | --draft-model GGUF]] [--daemon-arg=ARG ...]
Needs: pip install xllamacpp (bench only)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
from common import Daemon, LlamaServer, metric

from superfluid.runtime.registry import embedded_model
from tests.integration.draft_gguf import draft_gguf

MODEL = "SmolLM2-135M-Instruct"


def source_file(lines: int = 300, kind: str = "line") -> str:
    """A deterministic Python module of about `lines` lines (its functions parse_{kind}_N)."""
    out = [f'"""Inventory {kind}s: parsing, checking and summing."""', "", "import math", ""]
    i = 0
    while len(out) < lines:
        out += [f"def parse_{kind}_{i}({kind}):", f'    """Split {kind} {i} into its fields."""',
                f"    fields = {kind}.strip().split(',')", f"    if len(fields) != {3 + i % 4}:",
                f"        raise ValueError('{kind} {i} has the wrong number of fields')",
                f"    return [field.strip() for field in fields][:{3 + i % 4}]", "",
                f"def total_{i}(rows):", f"    return sum(float(r[{i % 3}]) for r in rows) * {1 + i % 5}", ""]
        i += 1
    return "\n".join(out[:lines])


KINDS = ("record", "entry", "item", "row", "order", "batch", "parcel", "ticket")


def agent_turns(kind: str, lines: int = 120) -> list[str]:
    """The recorded inputs of one agent task, turn by turn (the model's replies go between)."""
    path = f"{kind}s.py"
    code = source_file(lines, kind)
    return [
        f"SYSTEM: You are a coding agent. Tools: read_file(path), write_file(path, content).\n"
        f"USER: In {path}, rename parse_{kind}_3 to read_{kind}_3.\nASSISTANT: Plan:\n1.",
        '\nASSISTANT: Calling read_file.\n{"tool": "read_file", "arguments": {"path": "',
        f"\nTOOL read_file:\n{code}\nASSISTANT: Here is {path} with parse_{kind}_3 renamed to read_{kind}_3:\n"
        + "\n".join(code.splitlines()[:2]) + "\n",
        f"\nASSISTANT: Calling write_file.\n{{\"tool\": \"write_file\", \"arguments\": {{\"path\": \"{path}\", "
        f"\"content\": \"",
        "\nTOOL write_file: ok\nASSISTANT: Done. The plan was:\n1.",
    ]


TURN_TOKENS = (48, 24, 0, 48, 48)  # each turn's reply: 0 is --tokens (the file written back)


def agent_rate(url: str, kind: str, tokens: int) -> tuple[float, int]:
    """(decode tok/s, tokens) over one replayed task: each turn a completion of the transcript
    so far, its reply appended to it."""
    transcript, n, elapsed = "", 0, 0.0
    for turn, limit in zip(agent_turns(kind), TURN_TOKENS, strict=True):
        transcript += turn
        rate, k, text = decode_rate(url, {"prompt": transcript}, limit or tokens, text=True)
        transcript += text
        if k >= 2 and rate == rate:
            n, elapsed = n + k - 1, elapsed + (k - 1) / rate
    return (n / elapsed if elapsed else float("nan")), n


def edit(kind: str) -> dict:
    """The edit of a 300-line file. The embedded 135M model answers a chat "rename this
    function" with a code fence and stops, so it is asked as a completion it continues: the
    file again, its first lines given."""
    code = source_file(300, kind)
    return {"prompt": f"Here is a Python file:\n\n{code}\n\nHere is the same file with parse_{kind}_3 renamed to "
                      f"read_{kind}_3:\n\n" + "\n".join(code.splitlines()[:2]) + "\n"}


EDIT_KINDS = ("line", "field", "part", "unit", "cell", "slot", "page", "step")
QUESTIONS = (
    "Why do cats purr? Answer in a paragraph.", "Describe a walk through a forest in autumn.",
    "What makes a good team leader? Give some thoughts.", "How do bees make honey?",
    "Tell me about the history of bread.", "What should I pack for a week at the sea?",
    "Why is the sky blue? Explain simply.", "Describe a busy market in the morning.",
    "What are the benefits of learning to cook?", "How do trains stay on their tracks?",
    "Write a short story about a lost key.", "What makes a city pleasant to live in?",
    *(f"Tell me about {topic}. Write a paragraph." for topic in (
        "the moon", "volcanoes", "coffee", "the ocean tides", "libraries", "bicycles", "rain forests", "chess",
        "the violin", "glaciers", "lighthouses", "the printing press", "deserts", "kites", "owls", "bridges",
        "the compass", "snowflakes", "windmills", "penguins", "origami", "submarines", "coral reefs", "canals")))
# each round its own edit, questions and agent task: an output a server has already produced
# (greedy, the same prompt) would be drafted from its suffix tree in full, which no real
# workload gives
EDIT = edit("line")  # the warm-up


def free(r: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": QUESTIONS[(3 * r + i) % len(QUESTIONS)]}]} for i in range(3)]


def ngram(p, x) -> None:
    """llama-server's n-gram speculation (ngram-simple) at its defaults, one slot."""
    p.speculative.types = [x.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]


def decode_rate(url: str, body: dict, tokens: int, text: bool = False):
    """(decode tok/s, completion tokens[, the text]) of one greedy streamed chat (body has
    messages) or completion (body has a prompt)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    body = {"model": MODEL, **body, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    first = last = None
    n = 0
    parts: list[str] = []
    with httpx.stream("POST", url + path, json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                n = d["usage"]["completion_tokens"]
            got = [(c.get("delta") or {}).get("content") or c.get("text") or "" for c in d.get("choices") or []]
            if any(got):
                parts += got
                last = time.perf_counter()
                first = first or last
    rate = (n - 1) / (last - first) if first is not None and last is not None and last > first and n >= 2 \
        else float("nan")
    return (rate, n, "".join(parts)) if text else (rate, n)


def acceptance(url: str) -> tuple[float, float]:
    return metric(url, "superfluid_draft_tokens_total"), metric(url, "superfluid_draft_accepted_tokens_total")


SPEC = ("ngram", "suffix", "draft")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--spec-max-tokens", type=int, default=8, help="the daemons' --spec-max-tokens (default 8)")
    ap.add_argument("--draft", action="store_true", help="also a draft model (it accepted 0-2%% here)")
    ap.add_argument("--draft-layers", type=int, default=4, help="the draft model: the embedded model's first N layers")
    ap.add_argument("--draft-model", help="the draft model's GGUF instead (the embedded model's vocabulary)")
    ap.add_argument("--works", default="agent,edit,free", help="the workloads, comma-separated (default: all three)")
    ap.add_argument("--daemon-arg", action="append", default=[],
                    help="one more argument for every daemon (repeat it: --daemon-arg=--flash-attn --daemon-arg=off)")
    a = ap.parse_args()
    works = tuple(a.works.split(","))
    fresh = {"agent": len(KINDS), "edit": len(EDIT_KINDS) - 1, "free": len(QUESTIONS) // 3}  # rounds of new work
    if not works or not set(works) <= set(fresh):
        ap.error("--works is a list of agent, edit, free")
    if a.rounds > min(fresh[w] for w in works):
        ap.error(f"at most {min(fresh[w] for w in works)} rounds of new work for {a.works}")
    n_ctx = 8192
    servers = {name: Daemon("--speculative", name, "--spec-max-tokens", str(a.spec_max_tokens), *a.daemon_arg,
                            threads=a.threads, max_context=n_ctx, max_batch=1) for name in ("off", "ngram", "suffix")}
    if a.draft:
        draft = a.draft_model or draft_gguf(a.draft_layers)
        servers["draft"] = Daemon("--speculative", "draft", "--draft-model", draft, *a.daemon_arg, threads=a.threads,
                                  max_context=n_ctx, max_batch=1)
    urls = {k: d.url for k, d in servers.items()}
    peer = LlamaServer(embedded_model().path, a.threads, n_ctx, ngram)
    urls["llama-server ngram"] = peer.url
    spec = [name for name in SPEC if name in urls]
    rates: dict[tuple[str, str], list[float]] = {}  # each item's (task, edit, question)
    walls: dict[tuple[str, str], list[float]] = {}  # an item's seconds, its prompts' prefill included
    drafts = {(work, name): [0.0, 0.0] for work in works for name in spec}
    items = 0
    try:
        for url in urls.values():  # warm: the edit prompt prefilled and cached everywhere
            decode_rate(url, EDIT, 8)
        for r in range(a.rounds):
            for work in works:
                for body in ([None] if work == "agent" else [edit(EDIT_KINDS[1 + r % 7])] if work == "edit"
                             else free(r)):
                    items += 1
                    for name in (list(urls) if items % 2 else list(urls)[::-1]):  # the servers take turns
                        url = urls[name]
                        before = acceptance(url) if name in spec else (0.0, 0.0)
                        t0 = time.perf_counter()
                        rate = (agent_rate(url, KINDS[r % len(KINDS)], a.tokens)[0] if body is None
                                else decode_rate(url, body, a.tokens)[0])
                        rates.setdefault((work, name), []).append(rate)
                        walls.setdefault((work, name), []).append(time.perf_counter() - t0)
                        if name in spec:
                            after = acceptance(url)
                            drafts[(work, name)][0] += after[0] - before[0]
                            drafts[(work, name)][1] += after[1] - before[1]
    finally:
        for d in servers.values():
            d.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    paired = {k: statistics.geometric_mean(x / y for x, y in zip(v, rates[(k[0], "off")], strict=True))
              for k, v in rates.items()}
    print(f"decode tok/s, median over the items of {a.rounds} rounds, {a.threads} thread(s), {a.tokens} tokens, "
          f"greedy, --spec-max-tokens {a.spec_max_tokens}")
    peer_name = "llama-server ngram"
    for work in works:
        row = "  ".join(f"{name} {med[(work, name)]:.1f}" for name in urls)
        print(f"{work:5s} {row}")
        print("      " + ", ".join(f"{name} / off = {med[(work, name)] / med[(work, 'off')]:.2f}x "
                                   f"(paired {paired[(work, name)]:.2f}x)" for name in spec)
              + f", off / {peer_name} = {med[(work, 'off')] / med[(work, peer_name)]:.2f}x, "
              + ", ".join(f"{name} / {peer_name} = {med[(work, name)] / med[(work, peer_name)]:.2f}x" for name in spec))
        wall = {name: statistics.median(walls[(work, name)]) for name in urls}
        print("      seconds per item (prefill and decode, median): "
              + ", ".join(f"{name} {wall[name]:.2f}" for name in urls))
        for name in spec:
            n, ok = drafts[(work, name)]
            print(f"      {name}: drafted {n:.0f}, accepted {ok / max(1.0, n):.0%}")


if __name__ == "__main__":
    main()
