"""POST /v1/sessions/prune through the app (tests/harness.py): an admin key runs a retention
pass, another key gets a 403 and erases nothing; the erased count reaches /metrics."""

from superfluid.api.policy import KeyPolicy

from ..harness import MODEL, run

ADMIN, USER = "sk-admin-0123456789", "sk-user-0123456789"


def test_only_an_admin_key_prunes_and_the_count_reaches_the_metrics():
    async def body(h):
        c = h.client
        user = {"authorization": f"Bearer {USER}"}
        r = await c.post("/v1/chat/completions", headers=user, json={
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        sid = r.headers["x-superfluid-session"]
        out = {"user": await c.post("/v1/sessions/prune", headers=user, json={"older_than_days": 0})}
        out["kept"] = (await c.get(f"/v1/sessions/{sid}/events", headers=user)).status_code
        admin = {"authorization": f"Bearer {ADMIN}"}
        out["bad"] = await c.post("/v1/sessions/prune", headers=admin, json={"older_than_days": "soon"})
        out["admin"] = await c.post("/v1/sessions/prune", headers=admin, json={"older_than_days": 0})
        out["gone"] = (await c.get(f"/v1/sessions/{sid}/events", headers=user)).status_code
        out["metrics"] = (await c.get("/metrics", headers=admin)).text
        return out
    out = run(body, policies=(KeyPolicy("admin", ADMIN, admin=True), KeyPolicy("user", USER)))
    assert out["user"].status_code == 403 and out["kept"] == 200
    assert out["bad"].status_code == 400
    assert out["admin"].status_code == 200 and out["admin"].json() == {"object": "sessions.prune", "erased": 1}
    assert out["gone"] == 404
    assert "superfluid_sessions_pruned_total 1.0" in out["metrics"]
