"""The HTTP server: FastAPI routes for the OpenAI-compatible API, health and tokenizing.

Bodies are read raw and validated by api.schema (so a wrong type is a 400 naming the field,
not FastAPI's 422); every SuperfluidError becomes an OpenAI-style error body."""

from __future__ import annotations

import asyncio
import logging
import math
import time

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import __version__
from ..errors import BadRequest, Forbidden, NotSupported, PayloadTooLarge, SuperfluidError
from ..engine import health_row
from ..ids import new_id
from ..request import Qos
from ..service.capabilities import record as capabilities_record
from . import anthropic, embeddings, infill, llama, ollama, responses
from . import sessions as sessions_api
from . import ui as web_ui
from . import openai as oa
from .response_store import ResponseStore
from .guard import Guard, lan_names, pull_refused
from .policy import KeyPolicy, key_of
from .prompt import prompt_cache_hint, request_grammar
from .schema import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ModelRequest, PruneRequest,
                     TokenizeRequest, json_object, parse)
from .runner import Run, RunsEnd
from .streams import (ClientGone, chat_events, completion_events, session_header)

log = logging.getLogger("superfluid.api")


def _json(obj, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _error(e: SuperfluidError) -> Response:
    return _json(e.body(), e.status)


class BodyLimit:
    """ASGI middleware: a body over the limit is a 413 before any of it is parsed."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                return await _send_413(send, self.limit)
        seen, over, started = 0, False, False

        async def limited():
            nonlocal seen, over
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    over = True
                    raise _TooLarge()
            return msg

        async def answer(msg):  # once the body is over, the 413 is the only answer (not an error page's 500)
            nonlocal started
            if not over:
                started = started or msg["type"] == "http.response.start"
                await send(msg)

        try:
            await self.app(scope, limited, answer)
        except Exception:
            if not over:
                raise
        if over and not started:  # (a chunked body has no Content-Length to refuse it by)
            await _send_413(send, self.limit)


class _TooLarge(Exception):
    pass


async def _send_413(send, limit: int) -> None:
    body = orjson.dumps(PayloadTooLarge(f"the request body is over the {limit}-byte limit").body())
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def parse_qos(request: Request, default: Qos = Qos.AGENT) -> Qos:
    raw = request.headers.get("x-superfluid-qos")
    if raw is None:
        return default
    raw = raw.strip().lower()
    try:
        return Qos(int(raw)) if raw.isdigit() else Qos[raw.upper()]
    except (KeyError, ValueError):
        raise BadRequest(f"unknown x-superfluid-qos '{raw}': use interactive, completion, "
                         f"agent, background or embedding (0-4)", param="x-superfluid-qos") from None


def create_app(models, *, max_body: int = 16 * 1024 * 1024, default_qos: Qos = Qos.AGENT,
               metrics_registry: CollectorRegistry | None = None, policies: list[KeyPolicy] | None = None,
               loopback_bind: bool = True, ip_rpm: int | None = None, ui: bool = True,
               cors_origins: tuple[str, ...] = (), allow_model_paths: bool = False, retention=None,
               cache_isolation: bool = True, bind_host: str | None = None):
    """The ASGI app: routes, wrapped in the body limit and the guard (keys, origins, limits).
    `bind_host`: the address served on; without keys, off loopback, it bounds the Host header."""
    app = FastAPI(title="superfluid", version=__version__)
    started = int(time.time())
    metrics_registry = metrics_registry or CollectorRegistry()

    def qos(request: Request, default: Qos | None = None) -> Qos:
        """The request's class: its header, else its key's class, else `default` (the
        route's kind of work) or the server's --default-qos."""
        key = request.scope.get("state", {}).get("key")
        if key is not None and key.qos is not None:
            return parse_qos(request, key.qos)
        fallback = default if default is not None else default_qos
        if key is not None and fallback.rank < key.max_qos.rank:
            fallback = key.max_qos  # a route's default never lifts a key above its best class
        return parse_qos(request, fallback)

    @app.exception_handler(SuperfluidError)
    async def _on_error(request: Request, e: SuperfluidError):
        request.scope.setdefault("state", {}).setdefault("access", {})["error"] = e.code or e.type
        if request.url.path.startswith("/api/"):
            resp = ollama.error_response(e.status, e.message)
        elif request.url.path.startswith("/v1/messages"):
            resp = anthropic.error_response(e)
        elif llama.native(request.url.path):
            resp = llama.error_response(e)
        else:
            resp = _error(e)
        retry = getattr(e, "retry_after", None)
        if retry is not None:
            resp.headers["retry-after"] = str(max(1, math.ceil(retry)))
        return resp

    @app.exception_handler(ClientGone)
    async def _on_gone(request: Request, e: ClientGone):
        return Response(status_code=499)  # nobody is listening; nginx's "client closed request"

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, e: StarletteHTTPException):
        kind = "not_found" if e.status_code == 404 else "invalid_request_error"
        return _json({"error": {"message": f"{request.method} {request.url.path}: {e.detail}",
                                "type": kind, "param": None, "code": None}}, e.status_code)

    engines = models.engines  # the loaded ones

    async def engine_for(model: str | None):
        return await models.get(model)

    def require_admin(request: Request) -> None:
        key = request.scope.get("state", {}).get("key")
        if key is not None and not key.admin:
            raise Forbidden(f"key '{key.name}' is not an admin key")

    def model_card(mid: str) -> dict:
        eng = engines.get(mid)
        meta = {"loaded": eng is not None, "default": mid == models.default, "path": models.sources[mid].path}
        card = {"id": mid, "object": "model", "created": started, "owned_by": "superfluid"}
        if eng is not None:
            meta.update(n_ctx=eng.n_ctx, n_ctx_train=eng.info.n_ctx_train if eng.info else None,
                        n_vocab=eng.tokenizer.n_vocab, lanes=eng.cfg.max_batch)
            card.update(capabilities_record(eng))  # capabilities, window, output limit, sampling
        return {**card, "meta": meta}

    ollama.add_routes(app, models, qos)

    async def json_body(request: Request) -> dict:
        return json_object(await request.body())

    anthropic.add_routes(app, models, qos, json_body)
    embeddings.add_routes(app, models, qos)
    llama.add_routes(app, models, qos)
    infill.add_routes(app, models, qos)  # llama-server's /infill
    if models.sessions is not None:
        sessions_api.add_routes(app, models, qos)
    if models.sessions is not None:
        rstore = ResponseStore(models.sessions.store)
        responses.add_routes(app, models, qos, json_body, rstore)

    @app.get("/health")
    async def health(request: Request):
        stats = {mid: e.stats() for mid, e in engines.items()}  # the engine contract's one reading
        ready = models.default in stats and all(s.ready for s in stats.values())
        state = request.scope.get("state", {})
        if state.get("keys_required") and state.get("key") is None:  # no key: the status only
            return _json({"status": "ok" if ready else "unavailable"}, 200 if ready else 503)
        out = {"status": "ok" if ready else "unavailable", "models": {mid: health_row(s) for mid, s in stats.items()}}
        if models.sessions is not None:
            out["store"] = models.sessions.store.stats()
        return _json(out, 200 if ready else 503)

    @app.get("/metrics")
    async def metrics(request: Request):
        require_admin(request)  # every key's traffic, its drafts accepted: an oracle across keys
        return Response(generate_latest(metrics_registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models():
        return _json({"object": "list", "data": [model_card(m) for m in models.sources]})

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        return _json(model_card(models.resolve_id(model_id)))

    @app.post("/v1/models/load")
    async def load_model(request: Request):
        require_admin(request)
        body = parse(ModelRequest, await request.body())
        key = key_of(request)
        if not any(body.model.lower() == m.lower() for m in models.sources) and (why := pull_refused(request)):
            raise Forbidden(f"{body.model} is not a served model, and {why}", param="model")  # (a pull)
        if not any(body.model.lower() == m.lower() for m in models.sources) and not (
                allow_model_paths and key is not None and key.admin) and not models.pullable(body.model):
            models.resolve_id(body.model)  # a path: the same answer as for an unknown id (nothing of the disk)
        if body.reload and any(body.model.lower() == m.lower() for m in models.sources):
            await models.unload(body.model)
        eng = await models.load(body.model)
        return _json(model_card(eng.model_id))

    @app.post("/v1/models/unload")
    async def unload_model(request: Request):
        require_admin(request)
        body = parse(ModelRequest, await request.body())
        mid = models.resolve_id(body.model)
        await models.unload(mid)
        return _json(model_card(mid))

    @app.delete("/v1/models/{model_id:path}")
    async def delete_model(request: Request, model_id: str):
        require_admin(request)
        mid = models.resolve_id(model_id)
        if mid == models.default:
            raise BadRequest("the default model cannot be deleted; unload it instead", param="model")
        await models.unload(mid, forget=True)
        return _json({"id": mid, "object": "model", "deleted": True})

    @app.post("/v1/sessions/prune")
    async def prune_sessions(request: Request):
        """One retention pass now (admin): {"older_than_days": D} and/or {"max_mb": MB}, else
        the server's own policy (service/retention.py)."""
        require_admin(request)
        if retention is None:
            raise NotSupported("this server has no session retention")
        body = parse(PruneRequest, await request.body())
        erased = await retention.once(
            max_age=body.older_than_days * 86400 if body.older_than_days is not None else None,
            max_bytes=int(body.max_mb * 1024 * 1024) if body.max_mb is not None else None)
        return _json({"object": "sessions.prune", "erased": erased})

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = parse(TokenizeRequest, await request.body())
        eng = await engine_for(body.model)
        tok = eng.tokenizer

        def answer() -> Response:  # a body of megabytes takes seconds: off the event loop
            ids = (tok.encode_prompt(body.content) if body.add_special
                   else tok.encode(body.content, parse_special=body.parse_special))
            out: dict = {"tokens": ids, "count": len(ids), "max_context": eng.n_ctx}
            if body.with_pieces:  # llama-server's shape: [{id, piece}], a piece that is not UTF-8 as its bytes
                out["tokens"] = [{"id": t, "piece": llama.piece(tok.token_text(t))} for t in ids]
            return _json(out)
        return await asyncio.to_thread(answer)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = parse(DetokenizeRequest, await request.body())
        tok = (await engine_for(body.model)).tokenizer

        def answer() -> Response:  # off the event loop, as /tokenize
            bad = [t for t in body.tokens if not tok.valid(t)]
            if bad:
                raise BadRequest(f"token ids outside the vocabulary: {bad[:5]}", param="tokens")
            return _json({"content": tok.decode(body.tokens)})
        return await asyncio.to_thread(answer)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = parse(ChatCompletionRequest, await request.body())
        eng = await engine_for(body.model)
        cp = await asyncio.to_thread(oa.chat_prompt, eng, body)  # rendering and tokenizing: off the event loop
        top = (body.top_logprobs or 0) if body.logprobs else -1
        rid = new_id("chatcmpl")
        reqs = oa.gen_requests(body, cp.prompt, base_id=rid, n_ctx=eng.n_ctx, seed=eng.new_seed(),
                               default_max=None, top_logprobs=top, qos=qos(request),
                               max_tokens=body.max_completion_tokens, grammar=cp.grammar, channels=cp.channels,
                               tokenizer=eng.tokenizer, defaults=eng.sampling_defaults,
                               cache=prompt_cache_hint(body.prompt_cache_key, body.prompt_cache_retention,
                                                       len(cp.prompt)))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        created, t0 = int(time.time()), time.monotonic()
        run = await Run.submit(request, models.service, eng, reqs, cp.bodies, api="chat.completions", params={
            "response_id": rid, "created": created, "logprobs": bool(body.logprobs), "include_usage": include_usage,
            "timings": body.timings_per_token}, salt=body.cache_salt)
        if body.stream:
            return run.stream(chat_events(rid, eng.model_id, run.streams, body.logprobs, include_usage, reqs,
                                          created=created, with_timings=body.timings_per_token))
        choices = await run.collect()
        out = oa.chat_response(rid, eng.model_id, choices, body.logprobs)
        if body.verbose:
            out["__verbose"] = await asyncio.to_thread(llama.debug_block, choices[0], cp.prompt, eng.tokenizer,
                                                       eng.model_id, time.monotonic() - t0)
        resp = _json(out)
        resp.headers.update(session_header(reqs))
        return resp

    @app.post("/v1/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request):
        """A chat request's prompt tokens, nothing generated (llama-server's count)."""
        body = parse(ChatCompletionRequest, await request.body())
        eng = await engine_for(body.model)
        cp = await asyncio.to_thread(oa.chat_prompt, eng, body)
        return _json({"object": "response.input_tokens", "input_tokens": len(cp.prompt)})

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse(CompletionRequest, await request.body())
        eng = await engine_for(body.model)
        prompt = await asyncio.to_thread(oa.completion_prompt, eng, body)
        grammar = await asyncio.to_thread(request_grammar, body.grammar, body.json_schema)  # compiled: off the loop
        top = body.logprobs if body.logprobs is not None else -1
        rid = new_id("cmpl")
        reqs = oa.gen_requests(body, prompt, base_id=rid, n_ctx=eng.n_ctx, seed=eng.new_seed(), default_max=16,
                               top_logprobs=top, qos=qos(request, Qos.COMPLETION if body.suffix is not None else None),
                               tokenizer=eng.tokenizer, defaults=eng.sampling_defaults, grammar=grammar)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        created = int(time.time())
        run = await Run.submit(request, models.service, eng, reqs, api="completions", params={
            "response_id": rid, "created": created, "logprobs": top >= 0, "include_usage": include_usage},
            salt=body.cache_salt)
        if body.stream:
            return run.stream(completion_events(rid, eng.model_id, run.streams, top >= 0, include_usage, reqs,
                                                created=created))
        resp = _json(oa.completion_response(rid, eng.model_id, await run.collect(), top >= 0))
        resp.headers.update(session_header(reqs))
        return resp

    llama.add_unprefixed(app)  # /chat/completions, /completions, /models, as llama-server serves them
    # RunsEnd: a generation its handler left (raised after the submit) is cancelled, not left running
    lan = lan_names(bind_host) if bind_host is not None and not loopback_bind and not policies else None
    guarded = Guard(BodyLimit(RunsEnd(app), max_body), policies=policies or [], loopback_bind=loopback_bind,
                    ip_rpm=ip_rpm, cors_origins=cors_origins, cache_isolation=cache_isolation, lan_names=lan)
    if ui:  # the web app at / and /monitor (--no-ui: none)
        return web_ui.install(app, models, guarded, loopback_bind=loopback_bind, lan_names=lan)
    return guarded
