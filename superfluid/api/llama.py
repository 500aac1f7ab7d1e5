"""llama-server's own API, so its clients (editors, front-ends, llama.cpp's server tests) keep
working: POST /completion (whole or SSE), /apply-template, GET /props, /slots (read-only: the
lanes as slots), its error shape on these routes, and the OpenAI routes without /v1.
/tokenize and /detokenize are in app.py; /v1/messages/count_tokens in anthropic.py.
Generation goes through the same service and streams as /v1/completions."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import AsyncIterator

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from .. import __version__
from ..errors import BadRequest, ContextLengthExceeded, NotSupported, QueueFull, SuperfluidError
from ..ids import new_id
from ..request import Chunk, FinishReason, GenRequest, Qos, TokenLogprob
from ..service.capabilities import record as capabilities_record
from ..engine import for_api
from . import openai as oa
from . import resume
from .llama_params import DEFAULTS, Options, budget, options, prompt_tokens
from ..session.turns import context_text
from .schema import ChatCompletionRequest, json_object, parse
from .sse import cursor, event, tagged
from .runner import Run
from .streams import session_header, timings

NATIVE = frozenset({"/completion", "/completions", "/infill", "/tokenize", "/detokenize", "/apply-template", "/props",
                    "/slots"})
# llama-server's /completions (no /v1) is its native /completion, as there; /embeddings: embeddings.py
UNPREFIXED = ("/v1/chat/completions", "/v1/chat/completions/input_tokens", "/v1/models", "/v1/responses")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}


def _json(obj, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def native(path: str) -> bool:
    """A route whose errors take llama-server's shape."""
    return path in NATIVE or path.startswith("/slots/")


def error_body(e: SuperfluidError) -> dict:
    """llama-server's error: {"error": {"code": HTTP status, "message", "type"}}, plus the
    parameter at fault and, for a prompt over the window, its two counts."""
    own = e.body()["error"]
    kind = own["type"] if isinstance(e, ContextLengthExceeded) else ERROR_TYPES.get(e.status, "server_error")
    err: dict = {"code": e.status, "message": e.message, "type": kind}
    if e.param:
        err["param"] = e.param
    for k in ("n_prompt_tokens", "n_ctx"):
        if k in own:
            err[k] = own[k]
    return {"error": err}


def error_response(e: SuperfluidError) -> Response:
    return _json(error_body(e), e.status)


def stop_type(c: Chunk) -> str:
    return {FinishReason.END_OF_TURN: "eos", FinishReason.GRAMMAR: "eos", FinishReason.LENGTH: "limit",
            FinishReason.STOP_SEQUENCE: "word"}.get(c.finish, "none") if c.finish is not None else "none"


def settings(opts: Options | None, n_ctx: int, model: str, seed: int | None = None,
             defaults: dict | None = None) -> dict:
    """generation_settings (and /props' defaults when `opts` is None: llama-server's under the
    engine's `defaults`, the operator's and the model's)."""
    sp = opts.sampling if opts else None
    d = for_api(DEFAULTS, defaults or {})
    n_predict = opts.n_predict if opts else -1
    return {"n_ctx": n_ctx, "n_predict": n_predict, "model": model,
            "seed": seed if seed is not None else 0xFFFFFFFF,
            "temperature": sp.temperature if sp else d["temperature"],
            "top_k": sp.top_k if sp else d["top_k"], "top_p": sp.top_p if sp else d["top_p"],
            "min_p": sp.min_p if sp else d["min_p"],
            "repeat_penalty": sp.repeat_penalty if sp else d["repeat_penalty"],
            "typical_p": sp.typical_p if sp else d["typical_p"],
            "repeat_last_n": sp.repeat_last_n if sp else d["repeat_last_n"],
            "presence_penalty": sp.presence_penalty if sp else d["presence_penalty"],
            "frequency_penalty": sp.frequency_penalty if sp else d["frequency_penalty"],
            "stop": list(opts.stop) if opts else [], "max_tokens": n_predict,
            "ignore_eos": sp.ignore_eos if sp else False, "stream": opts.stream if opts else True,
            "n_probs": opts.n_probs if opts else 0, "grammar": sp.grammar if sp else "",
            "samplers": [s for s in (opts.samplers if opts else ("top_k", "typ_p", "top_p", "min_p", "temperature"))
                         if s in ("top_k", "typ_p", "top_p", "min_p", "temperature")]}


def piece(b: bytes) -> str | list[int]:
    """A token's text as llama-server's /tokenize gives it: a string, or its bytes when they
    are not UTF-8 on their own."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def probs(lps: list[TokenLogprob], post_sampling: bool = False) -> list[dict]:
    """completion_probabilities: logprobs of the model's distribution, or with
    post_sampling_probs the probabilities of the one the token was drawn from (`prob`,
    `top_probs`), as llama-server names them."""
    key, top = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def one(tok: int, text: bytes, lp: float) -> dict:
        return {"id": tok, "token": text.decode("utf-8", "replace"), "bytes": list(text),
                key: math.exp(lp) if post_sampling else lp}
    return [{**one(p.token, p.text, p.logprob), top: [one(*t) for t in p.top]} for p in lps]


def _fields(out: dict, fields: tuple[str, ...]) -> dict:
    """response_fields: only these, "a/b" lifted out of "a" under the name "b"."""
    if not fields:
        return out
    picked: dict = {}
    for f in fields:
        head, _, rest = f.partition("/")
        v = out.get(head)
        if rest:
            if isinstance(v, dict) and rest in v:
                picked[rest] = v[rest]
        elif head in out:
            picked[head] = v
    return picked


def final_body(c: Chunk, text: str, tokens: list[int], lps: list[TokenLogprob], *, opts: Options, model: str,
               n_ctx: int, seed: int, prompt: str, wall_s: float) -> dict:
    out = {"index": 0, "content": text, "tokens": tokens if opts.return_tokens else [], "id_slot": -1,
           "stop": True, "model": model, "tokens_predicted": c.completion_tokens,
           "tokens_evaluated": c.prompt_tokens, "generation_settings": settings(opts, n_ctx, model, seed),
           "prompt": prompt, "has_new_line": "\n" in text,
           "truncated": c.finish == FinishReason.LENGTH and c.prompt_tokens + c.completion_tokens >= n_ctx,
           "stop_type": stop_type(c), "stopping_word": c.stop_sequence or "",
           "stopped_eos": stop_type(c) == "eos", "stopped_word": stop_type(c) == "word",
           "stopped_limit": stop_type(c) == "limit", "tokens_cached": c.cached_tokens,
           "timings": timings(c, wall_s)}
    if opts.n_probs:
        out["completion_probabilities"] = probs(lps, opts.sampling.post_sampling)
    return _fields(out, opts.response_fields)


def debug_block(ch, prompt: list[int], tokenizer, model: str, wall_s: float) -> dict:
    """llama-server's `__verbose` on a chat answer (`verbose: true`): the prompt as the
    template rendered it, and the generation's counts and timings in /completion's words."""
    c = ch.last
    return {"content": "".join(ch.text), "prompt": context_text(tokenizer, prompt), "model": model,
            "tokens_predicted": c.completion_tokens, "tokens_evaluated": c.prompt_tokens,
            "tokens_cached": c.cached_tokens, "stop_type": stop_type(c), "stopping_word": c.stop_sequence or "",
            "timings": timings(c, wall_s)}


async def completion_events(chunks: AsyncIterator[Chunk], session: str | None, final,
                            post_sampling: bool = False) -> AsyncIterator[bytes]:
    """/completion's SSE: `data: {content, tokens, stop: false}` per piece, then the final
    body (`final(last chunk)`, content empty) or an error; no [DONE], as llama-server."""
    n = 0
    async for c in chunks:
        out: list[bytes] = []
        n += len(c.tokens)
        if c.progress is not None:
            out.append(event({"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": -1,
                              "prompt_progress": oa.prompt_progress(c.progress)}))
        if c.text or c.tokens:
            piece: dict = {"index": 0, "content": c.text, "tokens": c.tokens, "stop": False, "id_slot": -1,
                           "tokens_predicted": n, "tokens_evaluated": c.prompt_tokens}
            if c.logprobs:
                piece["completion_probabilities"] = probs(c.logprobs, post_sampling)
            out.append(event(piece))
        if c.finish is not None:
            out.append(event(error_body(c.error) if c.error is not None else final(c)))
        for o in tagged(out, cursor(session, c.event_id)):
            yield o
        if c.finish is not None:
            return


def _replay(sid: str, p: dict, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    """A resumed /completion stream (Last-Event-ID): the rest, in the same shape."""
    def final(c: Chunk) -> dict:
        return {"index": 0, "content": "", "tokens": [], "stop": True, "model": str(p.get("model") or ""),
                "tokens_predicted": c.completion_tokens, "tokens_evaluated": c.prompt_tokens,
                "stop_type": stop_type(c), "stopping_word": c.stop_sequence or ""}
    return completion_events(chunks, sid, final, bool(p.get("post_sampling")))


resume.register("llama.completion", _replay)


async def answer(models, eng, request: Request, prompt: list[int], opts: Options, seed: int, n_predict: int,
                 qos: Qos, rid: str) -> Response:
    """One generation in /completion's shape (/completion and /infill): its SSE stream or its
    whole answer. It is recorded as a /completion, so a resumed stream goes on in that shape."""
    req = GenRequest(f"{rid}-0", prompt, dataclasses.replace(opts.sampling, seed=seed), n_predict, opts.stop, qos,
                     progress=opts.return_progress and opts.stream)
    text = context_text(eng.tokenizer, prompt)
    t0 = time.monotonic()
    run = await Run.submit(request, models.service, eng, [req], api="llama.completion", params={
        "response_id": rid, "model": eng.model_id, "post_sampling": opts.sampling.post_sampling})

    def final(c: Chunk, content: str = "", tokens: list[int] | None = None, lps=()) -> dict:
        return final_body(c, content, tokens or [], list(lps), opts=opts, model=eng.model_id, n_ctx=eng.n_ctx,
                          seed=seed, prompt=text, wall_s=time.monotonic() - t0)

    if opts.stream:
        return run.stream(completion_events(run.streams[0], req.session, final, opts.sampling.post_sampling))
    toks: list[int] = []

    async def tap(it: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        async for c in it:
            toks.extend(c.tokens)
            yield c

    ch = (await run.collect(tap))[0]
    assert ch.last is not None
    resp = _json(final(ch.last, "".join(ch.text), toks, ch.logprobs))
    resp.headers.update(session_header([req]))
    return resp


def add_routes(app: FastAPI, models, qos_for) -> None:
    @app.post("/completion")
    @app.post("/completions")
    async def completion(request: Request):
        body = json_object(await request.body())
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise BadRequest("model must be a string", param="model")
        eng = await models.get(model)
        # a grammar or schema compiles, logit_bias text tokenizes: off the event loop
        opts = await asyncio.to_thread(options, body, eng.tokenizer, eng.sampling_defaults)
        prompt = await asyncio.to_thread(prompt_tokens, eng, body.get("prompt", ""))
        if not prompt:
            raise BadRequest("the prompt is empty", param="prompt")
        seed = opts.seed if opts.seed is not None else eng.new_seed()
        n_predict = budget(opts.n_predict, len(prompt), eng.n_ctx)
        if n_predict == 0:  # llama-server: the prompt is only evaluated; nothing to generate here
            c = Chunk("", finish=FinishReason.LENGTH, prompt_tokens=len(prompt))
            return _json(final_body(c, "", [], [], opts=opts, model=eng.model_id, n_ctx=eng.n_ctx, seed=seed,
                                    prompt=context_text(eng.tokenizer, prompt), wall_s=0.0))
        return await answer(models, eng, request, prompt, opts, seed, n_predict, qos_for(request), new_id("cmpl"))

    @app.post("/apply-template")
    async def apply_template(request: Request):
        body = parse(ChatCompletionRequest, await request.body())
        eng = await models.get(body.model)
        cp = await asyncio.to_thread(oa.chat_prompt, eng, body)
        return _json({"prompt": context_text(eng.tokenizer, cp.prompt)})

    @app.get("/props")
    async def props(request: Request):
        eng = await models.get(request.query_params.get("model"))
        src = models.sources[eng.model_id]
        rec = capabilities_record(eng)
        return _json({"default_generation_settings": {**slot(eng, 0, False), "prompt": ""},
                      "total_slots": eng.cfg.max_batch, "model_path": src.path, "model_alias": eng.model_id,
                      "chat_template": eng.tokenizer.chat_template or "", "chat_template_caps": {},
                      "modalities": {"vision": rec["capabilities"]["vision"] is True, "audio": False},
                      **rec,  # capabilities, window, output limit, recommended sampling (service/capabilities)
                      "build_info": f"superfluid {__version__}", "is_sleeping": False})

    @app.post("/props")
    async def set_props():
        raise NotSupported("this server does not change its properties at run time (llama-server's --props)")

    @app.get("/slots")
    async def slots(request: Request):
        eng = await models.get(request.query_params.get("model"))
        busy = len(eng.stats().lanes)
        if request.query_params.get("fail_on_no_slot") in ("1", "true") and busy >= eng.cfg.max_batch:
            raise QueueFull("no slot available")
        return _json([slot(eng, i, i < busy) for i in range(eng.cfg.max_batch)])

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: str):
        raise NotSupported("slots cannot be saved, restored or erased here: the prefix cache keeps "
                           "prompts warm by itself")


def slot(eng, i: int, processing: bool) -> dict:
    return {"id": i, "id_task": -1, "n_ctx": eng.n_ctx, "speculative": eng.cfg.speculative != "off",
            "is_processing": processing,
            "params": settings(None, eng.n_ctx, eng.model_id, defaults=eng.sampling_defaults),
            "next_token": {"has_next_token": processing, "has_new_line": False, "n_remain": -1,
                           "n_decoded": 0, "stopping_word": ""}}


def add_unprefixed(app: FastAPI) -> None:
    """The OpenAI routes without /v1, as llama-server serves them (call after they exist)."""
    for route in list(app.routes):
        path = getattr(route, "path", "")
        if path in UNPREFIXED:
            app.add_api_route(path[3:], route.endpoint, methods=list(route.methods))  # type: ignore[attr-defined]
