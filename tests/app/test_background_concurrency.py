"""A key's max_concurrent counts its background Responses (issue 33), in one process
(tests/harness.py): while one runs, the key's next generation request is a 429; polling and
cancelling it stay open; once it ends, the slot is free again. Another key is unaffected."""

import asyncio

from superfluid.api.policy import KeyPolicy

from ..fakes import FakeModel
from ..harness import MODEL, run

ONE = {"authorization": "Bearer sk-one-at-a-time"}
OTHER = {"authorization": "Bearer sk-another-key"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_background_responses_hold_a_concurrency_slot_until_they_end():
    m = FakeModel(step_delay=0.01)  # 400 tokens: four seconds, running while the test asks
    m.reply = lambda prompt: m.vocab.script(*["Hello"] * 400)

    async def body(h):
        c, out = h.client, {}
        r = await c.post("/v1/responses", headers=ONE, json={"model": MODEL, "input": "hi", "background": True,
                                                             "max_output_tokens": 400})
        rid = r.json()["id"]
        out["started"] = r.status_code
        out["second"] = await c.post("/v1/chat/completions", headers=ONE, json=CHAT)
        out["other key"] = await c.post("/v1/chat/completions", headers=OTHER, json=CHAT)
        out["poll"] = await c.get(f"/v1/responses/{rid}", headers=ONE)
        out["cancel"] = await c.post(f"/v1/responses/{rid}/cancel", headers=ONE)
        for _ in range(200):  # the task ends once the cancel reaches it
            if (await c.get(f"/v1/responses/{rid}", headers=ONE)).json()["status"] not in ("queued", "in_progress"):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        out["after"] = await c.post("/v1/chat/completions", headers=ONE, json=CHAT)
        return out
    out = run(body, m, policies=(KeyPolicy("one", "sk-one-at-a-time", max_concurrent=1),
                                 KeyPolicy("other", "sk-another-key", max_concurrent=1)))
    assert out["started"] == 200
    assert out["second"].status_code == 429
    assert out["second"].json()["error"]["code"] == "concurrency_limit_exceeded"
    assert out["other key"].status_code == 200
    assert out["poll"].status_code == 200 and out["cancel"].status_code == 200
    assert out["cancel"].json()["status"] == "cancelled"
    assert out["after"].status_code == 200, out["after"].text
