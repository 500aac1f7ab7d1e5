"""A stand-in for the Codex CLI (the real one is not installable offline): run as `codex` by
`superfluid launch codex`, it reads the provider `launch` configured (`-c model_providers.
superfluid={... base_url, env_key ...}`, `-c model_provider=superfluid`, `-m MODEL`), replays
the recorded Codex request sequence (tests/fixtures/codex/requests.json) to base_url +
/responses with the key from env_key, checks that each answer is a well-formed Responses
stream, writes what it saw to $RECORD and exits 0 only if every answer was well formed."""

import json
import os
import re
import sys

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "codex", "requests.json")


def config(argv: list[str]) -> tuple[str, str, str]:
    """(base_url, key, model) from the command line and environment launch gave."""
    sets = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-c"]
    provider = next(s.split("=", 1)[1] for s in sets if s.startswith("model_provider="))
    table = next(s for s in sets if s.startswith(f"model_providers.{provider}="))
    base_url = re.search(r'base_url="([^"]+)"', table).group(1)
    env_key = re.search(r'env_key="([^"]+)"', table).group(1)
    assert 'wire_api="responses"' in table, table
    return base_url, os.environ[env_key], argv[argv.index("-m") + 1]


def events(body: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in body.decode().split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln and not ln.startswith(":")]
        if not lines:
            continue
        name = next((ln[7:] for ln in lines if ln.startswith("event: ")), None)
        data = json.loads("".join(ln[6:] for ln in lines if ln.startswith("data: ")))
        out.append((name, data))
    return out


def check(evs: list[tuple[str, dict]]) -> dict:
    """The answer's final response, after checking the stream's grammar; AssertionError if not."""
    kinds = [d["type"] for _, d in evs]
    assert all(name == d["type"] for name, d in evs), "every event: line names its data's type"
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs))), "sequence numbers 0, 1, 2, ..."
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds[:2]
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds[-1]
    rid = evs[0][1]["response"]["id"]
    final = evs[-1][1]["response"]
    assert final["id"] == rid and all(d["response"]["id"] == rid for _, d in evs if "response" in d)
    added = {d["output_index"]: d["item"] for _, d in evs if d["type"] == "response.output_item.added"}
    done = {d["output_index"]: d["item"] for _, d in evs if d["type"] == "response.output_item.done"}
    assert sorted(added) == sorted(done) == list(range(len(final["output"]))), (added, done)
    assert [done[i] for i in sorted(done)] == final["output"], "the final output is the items done"
    for i, item in done.items():
        assert added[i]["id"] == item["id"] and added[i]["type"] == item["type"]
        if item["type"] == "message":
            text = "".join(d["delta"] for _, d in evs
                           if d["type"] == "response.output_text.delta" and d["output_index"] == i)
            assert item["content"][0]["text"] == text and item["role"] == "assistant"
        elif item["type"] == "function_call":
            args = "".join(d["delta"] for _, d in evs
                           if d["type"] == "response.function_call_arguments.delta" and d["output_index"] == i)
            assert item["arguments"] == args and item["call_id"] and item["name"]
            json.loads(args or "{}")
    usage = final["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] >= 0
    return final


def main() -> int:
    base_url, key, model = config(sys.argv[1:])
    seq = json.load(open(FIXTURE))
    headers = {**seq["headers"], "authorization": f"Bearer {key}"}
    conversation: list[dict] = []
    seen, last_output, ok = [], [], True
    with httpx.Client(timeout=300) as http:
        for req in seq["requests"]:
            body = {k: v for k, v in req.items() if k != "carry"}
            if req["carry"]:
                conversation += last_output
            conversation += req["input"]
            body.update(model=model, input=list(conversation))
            if os.environ.get("CODEX_MAX_OUTPUT_TOKENS"):  # Codex sends none; a test keeps answers short
                body["max_output_tokens"] = int(os.environ["CODEX_MAX_OUTPUT_TOKENS"])
            r = http.post(base_url + "/responses", json=body, headers=headers)
            entry = {"status": r.status_code, "content_type": r.headers.get("content-type", "")}
            try:
                assert r.status_code == 200, r.text
                assert entry["content_type"].startswith("text/event-stream"), entry["content_type"]
                final = check(events(r.content))
                last_output = final["output"]
                entry.update(id=final["id"], status_text=final["status"], output=final["output"], usage=final["usage"],
                             well_formed=True)
            except AssertionError as e:
                ok = False
                entry.update(well_formed=False, why=str(e)[:2000])
            seen.append(entry)
    with open(os.environ["RECORD"], "w") as f:
        json.dump({"argv": sys.argv[1:], "base_url": base_url, "model": model, "answers": seen}, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
