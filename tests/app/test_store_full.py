"""A session store at its cap (`--sessions-max-mb`), in one process (tests/harness.py) on a
real SQLite store in a folder: a request it cannot record is a typed 507 (free room and
retry), the daemon keeps serving, what was acknowledged is all there, and the store opens
again whole."""

from superfluid.session.store import Store

from ..harness import MODEL, run


def test_a_full_store_fails_requests_with_a_typed_error_and_stays_whole(tmp_path):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "lorem ipsum dolor " * 20}]}

    async def fill(h):
        ok, err = [], None
        for _ in range(400):
            r = await h.client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                err = r
                break
            ok.append(r.headers["x-superfluid-session"])
        health = (await h.client.get("/health")).json()
        last = [(await h.client.get(f"/v1/sessions/{sid}/events")).json()["data"] for sid in ok[-3:]]
        return ok, err, health, last
    ok, err, health, last = run(fill, store=Store(tmp_path, max_bytes=int(0.08 * 1024 * 1024)))
    assert err is not None, "the store never filled up"
    assert err.status_code == 507 and err.json()["error"]["code"] == "store_full", err.text  # typed: free room, retry
    assert health["status"] == "ok"  # the daemon keeps serving
    for events in last:  # what was acknowledged is all there
        assert events[-1]["type"] == "generated", events

    async def reopen(h):
        return (await h.client.get(f"/v1/sessions/{ok[0]}/events")).json()["data"]
    assert len(run(reopen, store=Store(tmp_path))) >= 4  # it opens again (quick_check passes), whole
