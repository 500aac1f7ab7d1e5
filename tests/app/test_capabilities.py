"""Capability records (issue 34): every API reports the same record of a loaded model, from
service/capabilities.py (OpenAI's /v1/models, Ollama's /api/show and /api/tags, llama-server's
/props), and what the record says is missing is refused with a 400 before anything is stored."""

from superfluid.service.capabilities import CAPABILITIES

from ..harness import MODEL, run


def test_every_api_reports_one_record_and_a_missing_capability_is_refused():
    async def body(h):
        c = h.client
        out = {"models": (await c.get("/v1/models")).json()["data"][0],
               "one": (await c.get(f"/v1/models/{MODEL}")).json(),
               "show": (await c.post("/api/show", json={"model": MODEL})).json(),
               "tags": (await c.get("/api/tags")).json()["models"][0],
               "props": (await c.get("/props")).json()}
        out["image"] = await c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]})
        out["rerank"] = await c.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["a", "b"]})
        out["sessions"] = (await c.get("/v1/sessions")).json()
        return out
    out = run(body)
    card = out["models"]
    caps = card["capabilities"]
    assert set(caps) == set(CAPABILITIES)
    assert all(v is True or (isinstance(v, str) and v) for v in caps.values())
    assert caps["chat"] is caps["completion"] is caps["tools"] is caps["structured_output"] is True
    assert isinstance(caps["vision"], str) and isinstance(caps["rerank"], str)
    assert card["context_window"] == card["meta"]["n_ctx"] and card["max_output_tokens"] <= card["context_window"]
    assert card["tool_dialect"] and isinstance(card["sampling"], dict)
    assert out["one"]["capabilities"] == caps
    assert out["props"]["capabilities"] == caps and out["props"]["context_window"] == card["context_window"]
    assert out["props"]["modalities"]["vision"] is False
    assert "completion" in out["show"]["capabilities"] and "tools" in out["show"]["capabilities"]
    assert "vision" not in out["show"]["capabilities"]
    assert ("insert" in out["show"]["capabilities"]) == (caps["fim"] is True)
    assert out["tags"]["details"]["quantization_level"] == out["show"]["details"]["quantization_level"]
    # what the record says is missing: a 400 naming it, and nothing stored
    assert out["image"].status_code == 400 and "image" in out["image"].json()["error"]["message"], out["image"].text
    assert out["rerank"].status_code == 400 and out["rerank"].json()["error"]["type"] == "invalid_request_error"
    assert out["sessions"]["data"] == []
