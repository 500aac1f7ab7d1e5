"""Who may start a pull from the hub, and how many at once (issue 54): Ollama's /api/pull and
an admin's load by hub name. One pull per name at a time (another is a 409); with keys only an
admin key; without keys only a client on this machine, and of pages only a loopback one (not a
page --cors-origins lets in); a refusal says nothing of the paths on this machine. The pull
itself is replaced by a stand-in here (the real one, with its size and disk bounds:
tests/integration/test_hub_bounds.py)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from superfluid.api.policy import KeyPolicy
from superfluid.runtime.registry import ModelSource
from superfluid.service import registry

from ..harness import BASE, run

ADMIN, USER = "sk-admin-0123456789", "sk-user-0123456789"
KEYS = (KeyPolicy("admin", ADMIN, admin=True), KeyPolicy("user", USER))


@pytest.fixture
def pulls(monkeypatch):
    """The pulls started (names), each held until `release` is set."""
    started: list[str] = []
    bounded: list[bool] = []  # whether each pull had the daemon's size and disk bounds
    release = threading.Event()

    def fake_resolve(name, report=None, bounds=None):
        started.append(name)
        bounded.append(bounds is not None)
        release.wait(10)
        return ModelSource("fake.gguf", name)
    monkeypatch.setattr(registry, "resolve", fake_resolve)
    return started, release, bounded


def test_one_pull_per_name_at_a_time(pulls):
    """Before, every request started its own download of the same files, each holding a thread."""
    started, release, bounded = pulls

    async def body(h):
        first = asyncio.create_task(h.client.post("/api/pull", json={"model": "org/model:Q4_K_M", "stream": False}))
        while not started:
            await asyncio.sleep(0.01)
        again = await h.client.post("/api/pull", json={"model": "ORG/model:Q4_K_M", "stream": False})
        loaded = await h.client.post("/v1/models/load", json={"model": "org/model:Q4_K_M"})
        release.set()
        return again, loaded, await first
    again, loaded, first = run(body)
    assert again.status_code == 409 and "being pulled already" in again.json()["error"], again.text
    assert loaded.status_code == 409, loaded.text  # a load by the same name waits its turn too
    assert first.status_code == 200 and first.json() == {"status": "success"}, first.text
    assert started == ["org/model:Q4_K_M"] and bounded == [True]  # within runtime/pull_bounds.py's bounds


def test_without_keys_only_this_machine_and_its_loopback_pages_may_pull(pulls):
    """Before, a LAN client of a keyless server, or any page --cors-origins lets in, could fill
    the disk with a pull."""
    started, release, _ = pulls
    release.set()

    async def body(h):
        lan = httpx.AsyncClient(transport=httpx.ASGITransport(app=h.app.asgi, client=("192.0.2.7", 40000)),
                                base_url=BASE)
        async with lan:
            out = {"lan": await lan.post("/api/pull", json={"model": "org/a", "stream": False}),
                   "lan load": await lan.post("/v1/models/load", json={"model": "org/a"})}
        out["allowed page"] = await h.client.post("/api/pull", json={"model": "org/b", "stream": False},
                                                  headers={"origin": "https://app.example"})
        out["loopback page"] = await h.client.post("/api/pull", json={"model": "org/c", "stream": False},
                                                   headers={"origin": "http://localhost:3000"})
        out["local"] = await h.client.post("/api/pull", json={"model": "org/d", "stream": False})
        return out
    out = run(body, cors_origins=("https://app.example",))
    for k in ("lan", "lan load", "allowed page"):
        assert out[k].status_code == 403, (k, out[k].text)
    assert out["loopback page"].status_code == 200 and out["local"].status_code == 200
    assert started == ["org/c", "org/d"]


def test_with_keys_only_an_admin_key_pulls_and_a_refusal_tells_nothing_of_paths(pulls, tmp_path, monkeypatch):
    """Before, a non-admin key got a 400 for a name that is a path here and a 403 for one that
    is not: a probe of the daemon's disk."""
    started, release, _ = pulls
    release.set()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "plans").write_text("x")
    monkeypatch.chdir(tmp_path)

    async def body(h):
        user, admin = {"authorization": f"Bearer {USER}"}, {"authorization": f"Bearer {ADMIN}"}
        there = await h.client.post("/api/pull", headers=user, json={"model": "secret/plans", "stream": False})
        absent = await h.client.post("/api/pull", headers=user, json={"model": "secret/other", "stream": False})
        ok = await h.client.post("/api/pull", headers=admin, json={"model": "org/e", "stream": False})
        return there, absent, ok
    there, absent, ok = run(body, policies=KEYS)
    assert there.status_code == absent.status_code == 403, (there.text, absent.text)
    assert there.json() == absent.json()
    assert ok.status_code == 200 and started == ["org/e"]
