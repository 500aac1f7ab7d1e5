"""The Ollama API (`/api/*`): translation onto GenRequest and from Chunks, NDJSON streams.

Chat and generate with Ollama's option names and defaults (format, tools, think), embed and
the older embeddings (through api/embeddings.py), model listing, show and ps. Images are
refused with a clear error; pull/push/create/delete/copy are 501."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any
from datetime import datetime, UTC

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from ..errors import BadRequest, Forbidden, SuperfluidError
from ..ids import new_id
from ..limits import arguments_text
from ..request import Calls, Chunk, GenRequest, Qos
from ..service.capabilities import ollama_names, quantization, record as capabilities_record
from .guard import pull_refused
from .embeddings import embed_texts, embedding_engine, shorten
from .ollama_options import logprobs_out, refuse_template, sampling, think_options, top_logprobs
from .schema import MAX_EMBED_INPUTS, json_object
from ..codec import fim, grammar
from ..codec.tools import new_call_id
from . import keep_alive, resume
from .prompt import chat_prompt, template_options
from .runner import Run

OLLAMA_VERSION = "0.12.0"  # the API level we follow
NDJSON = "application/x-ndjson"


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def error_response(status: int, message: str) -> Response:
    """Ollama's error shape: {"error": "message"}."""
    return Response(orjson.dumps({"error": message}), status_code=status, media_type="application/json")


def format_grammar(fmt: object) -> str:
    """Ollama `format`: "json" or a JSON schema."""
    if fmt is None or fmt == "":
        return ""
    if fmt == "json":
        return grammar.json_object("format")
    if isinstance(fmt, dict):
        return grammar.json_schema(fmt, "format")
    raise BadRequest("format must be \"json\" or a JSON schema object", param="format")


def chat_messages(msgs: object) -> list[dict]:
    """Ollama messages (tool calls with object arguments, `tool` results) in canonical form."""
    if not isinstance(msgs, list):
        raise BadRequest("messages must be a list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                not isinstance(m.get("content") or "", str):
            raise BadRequest("messages must be a list of {role, content} objects", param=f"messages.{i}")
        msg: dict = {"role": m["role"], "content": m.get("content") or ""}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise BadRequest("tool_calls must be a list", param=f"messages.{i}.tool_calls")
            msg["tool_calls"] = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest("each tool call needs function.name", param=f"messages.{i}.tool_calls")
                args = fn.get("arguments", {})
                msg["tool_calls"].append({"id": str(c.get("id") or new_call_id()), "type": "function", "function": {
                    "name": fn["name"], "arguments": arguments_text(args, f"messages.{i}.tool_calls")}})
        if m["role"] == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id") or m.get("tool_name") or "")
        out.append(msg)
    return out


def ollama_calls(calls: list) -> list[dict]:
    out = []
    for t in calls:
        try:
            args = orjson.loads(t.arguments)
        except orjson.JSONDecodeError:
            args = {}
        out.append({"function": {"name": t.name, "arguments": args}})
    return out


def refuse_unsupported(body: dict) -> None:
    if body.get("images") or any(isinstance(m, dict) and m.get("images") for m in body.get("messages") or []):
        raise BadRequest("this model takes text only: images are not supported", param="images")


def card(models, mid: str) -> dict:
    """A model as /api/tags lists it; a loaded one with its family, size and quantization."""
    src = models.sources[mid]
    size = os.path.getsize(src.path) if os.path.isfile(src.path) else 0
    digest = hashlib.sha256(f"{src.path}:{size}".encode()).hexdigest()
    details: dict[str, Any] = {"format": "gguf" if os.path.isfile(src.path) else "safetensors", "family": "",
                               "families": None, "parameter_size": "", "quantization_level": ""}
    eng = models.engines.get(mid)
    if eng is not None:
        family = eng.tokenizer.meta("general.architecture") or ""
        details.update(family=family, families=[family] if family else None,
                       parameter_size=eng.tokenizer.meta("general.size_label") or "",
                       quantization_level=quantization(eng))
    return {"name": mid, "model": mid, "modified_at": _now(), "size": size, "digest": digest, "details": details}


def final_fields(c: Chunk, total_s: float) -> dict:
    ttft = c.ttft_s or 0.0
    return {"done": True, "done_reason": "length" if c.finish and c.finish.openai == "length" else "stop",
            "total_duration": int(total_s * 1e9), "load_duration": 0,
            "prompt_eval_count": c.prompt_tokens, "prompt_eval_duration": int(ttft * 1e9),
            "eval_count": c.completion_tokens, "eval_duration": int(max(0.0, total_s - ttft) * 1e9)}


async def lines(model: str, chat: bool, stream, t0: float, wall: bool = False) -> AsyncIterator[bytes]:
    """An Ollama NDJSON stream from typed output chunks, live or replayed from the log (a
    tool call comes whole, in the line where it ends, as Ollama sends it). t0: when the
    request came (monotonic, or wall-clock time when `wall`)."""
    key = "message" if chat else "response"
    calls = Calls()
    async for c in stream:
        if c.error is not None:
            yield orjson.dumps({"error": c.error.message}) + b"\n"
            return
        piece: dict | str = {"role": "assistant", "content": c.text} if chat else c.text
        out: dict = {"model": model, "created_at": _now(), key: piece, "done": False}
        if c.reasoning:
            if chat:
                piece["thinking"] = c.reasoning  # type: ignore[index]
            else:
                out["thinking"] = c.reasoning
        before = len(calls.done)
        calls.add(c.calls)
        if chat and len(calls.done) > before:
            piece["tool_calls"] = ollama_calls(calls.done[before:])  # type: ignore[index]
        if c.logprobs:
            out["logprobs"] = logprobs_out(c.logprobs)
        if c.finish is not None:
            out.update(final_fields(c, (time.time() if wall else time.monotonic()) - t0))
        yield orjson.dumps(out) + b"\n"


def _replay(chat: bool):
    def translate(sid: str, p: dict, chunks) -> AsyncIterator[bytes]:
        return lines(str(p.get("model") or ""), chat, chunks, float(p.get("t0") or time.time()), wall=True)
    return translate


resume.register("ollama.chat", _replay(True), NDJSON)
resume.register("ollama.generate", _replay(False), NDJSON)


def add_routes(app: FastAPI, models, qos_for) -> None:
    @app.api_route("/", methods=["GET", "HEAD"])  # Claude Code checks the server with HEAD / first
    async def root():
        return Response("Ollama is running", media_type="text/plain")

    @app.get("/api/version")
    async def version():
        return {"version": OLLAMA_VERSION}

    @app.get("/api/tags")
    async def tags():
        return {"models": [card(models, m) for m in models.sources]}

    @app.get("/api/ps")
    async def ps():
        return {"models": [{**card(models, m), "expires_at": keep_alive.expires_at(models, m),
                            "size_vram": getattr(models.engines[m].offload, "device_bytes", 0)}
                           for m in models.engines]}

    @app.post("/api/show")
    async def show(request: Request):
        body = json_object(await request.body())
        mid = models.resolve_id(body.get("model") or body.get("name"))
        eng = await models.get(mid)
        tok = eng.tokenizer
        arch = tok.meta("general.architecture") or "llama"
        rec = capabilities_record(eng)
        params = "\n".join(f"{k} {v:g}" for k, v in sorted(rec["sampling"].items()))
        return {"modelfile": f"FROM {models.sources[mid].path}\n", "parameters": params,
                "template": tok.chat_template or "", "details": card(models, mid)["details"],
                "model_info": {"general.architecture": arch, f"{arch}.context_length": eng.n_ctx,
                               f"{arch}.block_count": tok.shape.n_layer,
                               f"{arch}.embedding_length": tok.shape.n_embd},
                "capabilities": ollama_names(rec["capabilities"]), "modified_at": _now()}

    @app.post("/api/chat")
    async def chat(request: Request):
        body = json_object(await request.body())
        return await _generate(request, body, chat=True)

    @app.post("/api/generate")
    async def generate(request: Request):
        body = json_object(await request.body())
        return await _generate(request, body, chat=False)

    @app.post("/api/pull")
    async def pull(request: Request):
        """A model by its Hugging Face name into the cache, then served (unloaded until its
        first request), with Ollama's progress lines; only where a request may load models."""
        body = json_object(await request.body())
        name = body.get("model") or body.get("name")
        why = pull_refused(request)  # before the name is looked at: it may be a path on this machine
        if why is not None:
            raise Forbidden(f"pulling a model loads it, and {why}", param="model")
        if not isinstance(name, str) or not models.pullable(name):
            raise BadRequest("model must be a Hugging Face name: OWNER/REPO[:QUANT|:FILE]", param="model")
        return await _pull(models, name, stream=body.get("stream", True) is not False)

    for path in ("/api/push", "/api/create", "/api/copy", "/api/blobs/{digest}"):
        app.add_api_route(path, _not_here, methods=["POST", "HEAD"])
    app.add_api_route("/api/delete", _not_here, methods=["DELETE"])
    @app.post("/api/embed")
    async def embed(request: Request):
        return await _embed(request, json_object(await request.body()), legacy=False)

    @app.post("/api/embeddings")
    async def embeddings(request: Request):
        return await _embed(request, json_object(await request.body()), legacy=True)

    async def _embed(request: Request, body: dict, *, legacy: bool):
        t0 = time.monotonic()
        field = "prompt" if legacy else "input"
        inp = body.get(field)
        texts = [inp] if isinstance(inp, str) else inp
        if (not isinstance(texts, list) or not texts or len(texts) > MAX_EMBED_INPUTS
                or not all(isinstance(t, str) for t in texts)):
            raise BadRequest(f"{field} must be a string{'' if legacy else ' or a list of 1 to 2048 strings'}",
                             param=field)
        truncate = body.get("truncate", True)
        if not isinstance(truncate, bool):
            raise BadRequest("truncate must be true or false", param="truncate")
        ka = keep_alive.parse(body.get("keep_alive"))
        dims = body.get("dimensions")
        if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
            raise BadRequest("dimensions must be a positive integer", param="dimensions")
        model = body.get("model")
        eng = await embedding_engine(models, model if isinstance(model, str) else None)
        q = qos_for(request, Qos.EMBEDDING)
        vectors, tokens = await embed_texts(eng, texts, None, truncate=-1 if truncate else None, qos=q)
        vectors = shorten(eng, vectors, dims)
        request.scope.setdefault("state", {}).setdefault("access", {}).update(
            model=eng.model_id, qos=q.name.lower(), prompt_tokens=tokens)
        keep_alive.apply(request, models, eng.model_id, ka)  # 0: unloaded once nobody uses it
        if legacy:
            return {"embedding": vectors[0].tolist()}
        return {"model": eng.model_id, "embeddings": [v.tolist() for v in vectors],
                "total_duration": int((time.monotonic() - t0) * 1e9), "load_duration": 0,
                "prompt_eval_count": tokens}

    async def _generate(request: Request, body: dict, *, chat: bool):
        t0 = time.monotonic()
        if body.get("model") is not None and not isinstance(body.get("model"), str):  # None: the default model
            raise BadRequest("model must be a string", param="model")
        if not chat and body.get("prompt") is not None and not isinstance(body["prompt"], str):
            raise BadRequest("prompt must be a string", param="prompt")  # (not a number made text)
        ka = keep_alive.parse(body.get("keep_alive"))
        key = "message" if chat else "response"
        empty = {"role": "assistant", "content": ""} if chat else ""
        msgs = body.get("messages") or []
        if (chat and not msgs) or (not chat and not body.get("prompt")):
            mid = models.resolve_id(body.get("model"))
            if ka == 0 and mid != models.default:  # Ollama's way to unload a model
                if not keep_alive.may_change(request):
                    raise Forbidden("only an admin key may unload a model")
                if mid in models.engines:
                    models.keep(mid, 0)  # now if it is idle, else once it is
                    if models.engines[mid].idle:
                        await models.unload(mid)
                return {"model": mid, "created_at": _now(), key: empty, "done": True, "done_reason": "unload"}
            eng = await models.get(mid)  # loads it (the default model stays loaded whatever keep_alive says)
            keep_alive.apply(request, models, eng.model_id, ka)
            return {"model": eng.model_id, "created_at": _now(), key: empty, "done": True, "done_reason": "load"}
        eng = await models.get(body.get("model"))
        refuse_unsupported(body)
        g = format_grammar(body.get("format"))
        refuse_template(body)
        kw = template_options(**think_options(body.get("think")))
        top = top_logprobs(body)
        channels = None
        fill = None if chat else body.get("suffix")
        if fill is not None and not isinstance(fill, str):
            raise BadRequest("suffix must be a string", param="suffix")
        if fill and body.get("raw"):
            raise BadRequest("raw mode does not support suffix", param="suffix")
        if chat:
            # tool_choice is a superfluid extension (Ollama has none): "required" or a name forces a call
            cm = chat_messages(msgs)
            cp = await asyncio.to_thread(  # rendering and tokenizing: off the event loop
                lambda: chat_prompt(eng, cm, tools=body.get("tools"), tool_choice=body.get("tool_choice"),
                                    grammar=g, template_kwargs=kw))
            bodies, prompt, channels, g = cp.bodies, cp.prompt, cp.channels, cp.grammar
        elif fill:  # fill in the middle: the prompt is the code before the gap, no chat template
            bodies, prompt = None, await asyncio.to_thread(
                fim.fill, eng.tokenizer, str(body["prompt"]), fill, "suffix", f"the model {eng.model_id}")
        elif body.get("raw"):
            bodies, prompt = None, await asyncio.to_thread(eng.encode_prompt, str(body["prompt"]))
        else:
            turns = ([{"role": "system", "content": str(body["system"])}] if body.get("system") else [])
            conv = turns + [{"role": "user", "content": str(body["prompt"])}]
            cp = await asyncio.to_thread(lambda: chat_prompt(eng, conv, grammar=g, template_kwargs=kw))
            bodies, prompt, channels = cp.bodies, cp.prompt, cp.channels
        sp, num_predict, stops = sampling(body.get("options"), eng.new_seed(), eng.sampling_defaults)
        sp = replace(sp, grammar=g, top_logprobs=top)
        room = max(1, eng.n_ctx - len(prompt))  # Ollama cuts num_predict to the window; the engine checks it
        req = GenRequest(new_id("ollama"), prompt, sp, min(num_predict or room, room), stops,
                         qos_for(request, Qos.COMPLETION if fill else None), channels=channels)
        run = await Run.submit(request, models.service, eng, [req], bodies,
                               api="ollama." + ("chat" if chat else "generate"),
                               params={"response_id": req.id, "t0": time.time()})
        keep_alive.apply(request, models, eng.model_id, ka)  # submitted: 0 unloads it once the request is done
        model = eng.model_id
        if body.get("stream", True):
            return run.stream(lines(model, chat, run.streams[0], t0), NDJSON)
        c = (await run.collect())[0]
        assert c.last is not None  # collect() returns only finished choices
        text_out = "".join(c.text)
        thinking = "".join(c.reasoning)
        out: dict = {"model": model, "created_at": _now(),
                     key: {"role": "assistant", "content": text_out} if chat else text_out,
                     **final_fields(c.last, time.monotonic() - t0)}
        if chat and c.tool_calls:
            out[key]["tool_calls"] = ollama_calls(c.tool_calls)
        if c.logprobs:
            out["logprobs"] = logprobs_out(c.logprobs)
        if thinking:
            if chat:
                out[key]["thinking"] = thinking
            else:
                out["thinking"] = thinking
        return out


async def _pull(models, name: str, *, stream: bool) -> Response:
    """Ollama's /api/pull answer: NDJSON progress ({"status": "pulling FILE", "total",
    "completed"}) then {"status": "success"}, or an {"error"} line; one object without stream."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[dict | None] = asyncio.Queue()
    status = [400]  # a failed pull's (409: the name is being pulled, 413, 507: runtime/pull_bounds.py)

    def report(file: str, done: int, total: int) -> None:  # on the pull's thread
        loop.call_soon_threadsafe(events.put_nowait, {"status": f"pulling {file}", "total": total, "completed": done})

    async def run() -> None:
        try:
            await models.pull(name, report)
            events.put_nowait({"status": "success"})
        except SuperfluidError as e:
            status[0] = e.status
            events.put_nowait({"error": e.message})
        finally:
            events.put_nowait(None)

    task = asyncio.create_task(run())
    _PULLS.add(task)  # held: a pull goes on when its client leaves (the file is worth having)
    task.add_done_callback(_PULLS.discard)
    if not stream:
        await task
        last: dict = {}
        while (ev := events.get_nowait()) is not None:
            last = ev
        if "error" in last:
            return error_response(status[0], last["error"])
        return Response(orjson.dumps(last), media_type="application/json")

    async def lines() -> AsyncIterator[bytes]:
        yield orjson.dumps({"status": "pulling manifest"}) + b"\n"
        while (ev := await events.get()) is not None:
            yield orjson.dumps(ev) + b"\n"

    return StreamingResponse(lines(), media_type=NDJSON)


_PULLS: set[asyncio.Task] = set()


async def _not_here():
    return error_response(501, "superfluid serves model files and Hugging Face names: push, create, copy and delete "
                       "are not supported (pull OWNER/REPO[:QUANT], or superfluid serve --model PATH)")
