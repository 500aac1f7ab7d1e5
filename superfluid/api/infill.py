"""llama-server's POST /infill: code completion for editors (llama.vscode, llama.vim).

The body's input_prefix, input_suffix, input_extra and prompt become one fill-in-the-middle
prompt (codec/fim.py, llama.cpp's layout); every other field is a /completion option and the
answer is /completion's (api/llama.py and api/llama_params.py own both). Infill runs in the
completion class by default: ahead of agents, behind a chat."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..codec import fim
from ..errors import BadRequest, ContextLengthExceeded
from ..ids import new_id
from ..request import Chunk, GenRequest, Qos
from ..session.turns import context_text
from .llama import completion_events, final_body
from .llama_params import budget, options
from .policy import owner_of
from .schema import InfillRequest, json_object, parse
from .streams import collect, raise_first_error, record, session_header, sse


def build_prompt(engine, body: InfillRequest, reserve: int) -> list[int]:
    """The request's FIM prompt; extra files are cut to leave `reserve` tokens of the window."""
    tok = engine.tokenizer
    tokens = fim.tokens_of(tok, "input_suffix", f"the model {engine.model_id}")
    return fim.infill_prompt(tok, tokens, body.input_prefix, body.input_suffix, prompt=body.prompt,
                             files=[(f.filename, f.text) for f in body.input_extra], budget=engine.n_ctx - reserve)


def add_routes(app: FastAPI, models, qos_for) -> None:
    @app.post("/infill")
    async def infill(request: Request):
        raw = await request.body()
        body, fields = json_object(raw), parse(InfillRequest, raw)
        eng = await models.get(fields.model)
        # a grammar compiles: off the event loop
        opts = await asyncio.to_thread(options, body, eng.tokenizer, eng.sampling_defaults)
        if opts.n_predict == 0:
            raise BadRequest("n_predict must be -1 (until the window is full) or at least 1", param="n_predict")
        reserve = opts.n_predict if opts.n_predict > 0 else eng.n_ctx // 4
        prompt = await asyncio.to_thread(build_prompt, eng, fields, reserve)  # tokenizing: off the event loop
        if len(prompt) >= eng.n_ctx:
            raise ContextLengthExceeded(f"This model's maximum context length is {eng.n_ctx} tokens; the infill "
                                        f"prompt alone has {len(prompt)}.", param="input_prefix")
        seed = opts.seed if opts.seed is not None else eng.new_seed()
        rid = new_id("infill")
        req = GenRequest(f"{rid}-0", prompt, dataclasses.replace(opts.sampling, seed=seed),
                         budget(opts.n_predict, len(prompt), eng.n_ctx), opts.stop, qos_for(request, Qos.COMPLETION))
        t0 = time.monotonic()
        # recorded as a /completion: a stream resumed with Last-Event-ID goes on in its shape
        streams = await models.service.submit(eng, [req], api="llama.completion", params={
            "response_id": rid, "model": eng.model_id}, owner=owner_of(request))
        rec = request.scope.setdefault("state", {}).setdefault("access", {})
        rec.update(model=eng.model_id, qos=req.qos.name.lower())
        text = context_text(eng.tokenizer, prompt)

        def final(c: Chunk, content: str = "", tokens: list[int] | None = None, lps=()) -> dict:
            record(rec, [c])
            return final_body(c, content, tokens or [], list(lps), opts=opts, model=eng.model_id, n_ctx=eng.n_ctx,
                              seed=seed, prompt=text, wall_s=time.monotonic() - t0)

        if opts.stream:
            return sse(completion_events(streams[0], req.session, final), models.service.on_close(eng, [req]), [req])
        toks: list[int] = []

        async def tap(it: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
            async for c in it:
                toks.extend(c.tokens)
                yield c

        choices = await collect(request, [tap(streams[0])])
        raise_first_error(choices)
        ch = choices[0]
        assert ch.last is not None
        resp = Response(orjson.dumps(final(ch.last, "".join(ch.text), toks, ch.logprobs)),
                        media_type="application/json")
        resp.headers.update(session_header([req]))
        return resp
