"""llama-server's POST /infill: code completion for editors (llama.vscode, llama.vim).

The body's input_prefix, input_suffix, input_extra and prompt become one fill-in-the-middle
prompt (codec/fim.py, llama.cpp's layout); every other field is a /completion option and the
answer is /completion's (api/llama.py and api/llama_params.py own both). Infill runs in the
completion class by default: ahead of agents, behind a chat."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request

from ..codec import fim
from ..errors import BadRequest, ContextLengthExceeded
from ..ids import new_id
from ..request import Qos
from .llama import answer
from .llama_params import budget, options
from .schema import InfillRequest, json_object, parse


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
        return await answer(models, eng, request, prompt, opts, seed, budget(opts.n_predict, len(prompt), eng.n_ctx),
                            qos_for(request, Qos.COMPLETION), new_id("infill"))
