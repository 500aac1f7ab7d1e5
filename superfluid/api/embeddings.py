"""Embeddings and rerank: OpenAI `/v1/embeddings`, Ollama `/api/embed` and `/api/embeddings`
(registered by api/ollama.py), and `/v1/rerank` (the query / documents / top_n shape that
llama-server, vLLM, Jina and Cohere share).

Translation only: inputs become token ids (tokenized off the event loop), the engine's
embedder batches them through the scheduler and checks them against the window, vectors
become each API's shape. An embedding request is not a session: nothing is logged but the
access-log line and the metrics."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..engine import EmbedInput
from ..engine import check_embed as check
from ..errors import BadRequest
from ..ids import new_id
from ..request import Qos
from .schema import EmbeddingRequest, RerankDocument, RerankRequest, parse


def _json(obj) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


async def embedding_engine(models, model: str | None):
    """The engine that answers an embedding request: the named model, else the embedding
    model (`--embedding-model`), else the default model."""
    return await models.get(model if model is not None else getattr(models, "embedding", None))


def _cut(tokens: list[int], limit: int, pieces: list[bytes]) -> list[int]:
    """The first `limit` tokens, keeping a closing special token ([SEP], EOS) in place."""
    if len(tokens) <= limit:
        return tokens
    if tokens and not pieces[tokens[-1]] and limit > 1:
        return tokens[:limit - 1] + tokens[-1:]
    return tokens[:limit]


def _tokenize(tok, texts: list[str], limit: int | None) -> list[list[int]]:
    out = [tok.encode(t, add_special=True) for t in texts]
    return out if limit is None else [_cut(t, limit, tok.pieces) for t in out]


async def embed_texts(eng, texts: list[str] | None, ids: list[list[int]] | None, *, truncate: int | None,
                      qos: Qos) -> tuple[list[np.ndarray], int]:
    """Vectors for texts (tokenized here, off the event loop) or token ids, and the tokens
    they took. `truncate`: cut each input to that many tokens (None: over the window is a 400)."""
    window = eng.embed_window
    if not window:  # before any tokenizing: a model that cannot embed answers at once
        check(eng, [])
    eng.last_used = time.monotonic()  # an idle reaper must not unload it while we tokenize
    limit = None if truncate is None or not window else min(window, truncate) if truncate > 0 else window
    if texts is not None:
        ids = await asyncio.to_thread(_tokenize, eng.tokenizer, texts, limit)
    elif limit is not None:
        ids = [t[:limit] for t in ids or []]
    inputs = [EmbedInput(list(t)) for t in ids or []]
    vectors = await eng.embed(inputs, qos)
    return vectors, sum(len(x.tokens) for x in inputs)


def shorten(eng, vectors: list[np.ndarray], dimensions: int | None) -> list[np.ndarray]:
    """`dimensions`: the first N values, renormalised, for models trained for it."""
    if dimensions is None or not vectors or dimensions == len(vectors[0]):
        return vectors
    full = len(vectors[0])
    if dimensions > full:
        raise BadRequest(f"dimensions must be at most {full} for {eng.model_id}", param="dimensions")
    if not eng.cfg.matryoshka:
        raise BadRequest(f"the model {eng.model_id} was not trained for shortened embeddings: dimensions "
                         f"must be {full} (serve it with --matryoshka to allow it)", param="dimensions")
    out = []
    for v in vectors:
        cut = v[:dimensions]
        norm = float(np.linalg.norm(cut))
        out.append(cut / norm if norm > 0 else cut)
    return out


def _openai_body(model: str, vectors: list[np.ndarray], encoding: str, tokens: int) -> bytes:
    """The reply, serialised off the event loop (2048 vectors of thousands of floats)."""
    if encoding == "base64":
        data: list = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() for v in vectors]
    else:
        data = [v.tolist() for v in vectors]
    return orjson.dumps({"object": "list", "model": model,
                         "data": [{"object": "embedding", "index": i, "embedding": d} for i, d in enumerate(data)],
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _record(request: Request, eng, qos: Qos, tokens: int) -> None:
    rec = request.scope.setdefault("state", {}).setdefault("access", {})
    rec.update(model=eng.model_id, qos=qos.name.lower(), prompt_tokens=tokens)


def _sigmoid(x: float) -> float:
    return float(1.0 / (1.0 + np.exp(-x)))


def add_routes(app: FastAPI, models, qos_for) -> None:
    def qos(request: Request) -> Qos:
        return qos_for(request, Qos.EMBEDDING)  # without a class of their own: embedding work

    async def embeddings(request: Request):
        body = parse(EmbeddingRequest, await request.body())
        eng = await embedding_engine(models, body.model)
        inp = body.input
        texts = [inp] if isinstance(inp, str) else inp if isinstance(inp[0], str) else None
        ids = None if texts is not None else [inp] if isinstance(inp[0], int) else inp
        truncate = body.truncate_prompt_tokens if body.truncate_prompt_tokens is not None else (
            -1 if body.truncate else None)
        q = qos(request)
        vectors, tokens = await embed_texts(eng, texts, ids, truncate=truncate, qos=q)  # type: ignore[arg-type]
        vectors = shorten(eng, vectors, body.dimensions)
        _record(request, eng, q, tokens)
        return Response(await asyncio.to_thread(_openai_body, eng.model_id, vectors, body.encoding_format, tokens),
                        media_type="application/json")

    async def rerank(request: Request):
        body = parse(RerankRequest, await request.body())
        eng = await embedding_engine(models, body.model)
        docs = [d.text if isinstance(d, RerankDocument) else d for d in body.documents]
        q = qos(request)
        if eng.model_kind == "cross-encoder":
            scores, tokens = await _cross_scores(eng, body.query, docs, body.truncate, q)
            scoring = "cross-encoder"
        else:
            vectors, tokens = await embed_texts(eng, [body.query, *docs], None,
                                                truncate=-1 if body.truncate else None, qos=q)
            qv = vectors[0] / max(float(np.linalg.norm(vectors[0])), 1e-12)
            scores = [float(np.dot(qv, v) / max(float(np.linalg.norm(v)), 1e-12)) for v in vectors[1:]]
            scoring = "cosine"  # no classification head: similarity of embeddings
        _record(request, eng, q, tokens)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[:body.top_n or len(docs)]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": docs[i]}} if body.return_documents else {})} for i in order]
        return _json({"id": new_id("rerank"), "object": "list", "model": eng.model_id, "scoring": scoring,
                      "results": results, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    for path in ("/v1/embeddings", "/embeddings"):
        app.add_api_route(path, embeddings, methods=["POST"])
    for path in ("/v1/rerank", "/rerank"):
        app.add_api_route(path, rerank, methods=["POST"])


async def _cross_scores(eng, query: str, docs: list[str], truncate: bool, qos: Qos) -> tuple[list[float], int]:
    """Relevance of each document to the query from a cross-encoder's classifier: the
    sigmoid of a single logit, or the probability of the last label."""
    window = eng.embed_window
    tok = eng.tokenizer
    if not window:
        check(eng, [])  # a model that cannot score answers before any tokenizing
    eng.last_used = time.monotonic()

    def encode() -> list[EmbedInput]:
        out = []
        for ids, at in tok.encode_pairs(query, docs):  # the query tokenized once
            if truncate and len(ids) > window:
                ids = _cut(ids, window, tok.pieces)
            out.append(EmbedInput(ids, max(1, min(at, len(ids) - 1))))
        return out

    inputs = await asyncio.to_thread(encode)
    logits = await eng.embed(inputs, qos)
    scores = []
    for v in logits:
        if len(v) == 1:
            scores.append(_sigmoid(float(v[0])))
        else:
            e = np.exp(v - v.max())
            scores.append(float(e[-1] / e.sum()))
    return scores, sum(len(x.tokens) for x in inputs)
