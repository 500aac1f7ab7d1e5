"""OpenAI chat completions and completions: translate bodies onto GenRequests, and Chunks
back into OpenAI objects (whole responses and stream chunks)."""

from __future__ import annotations

import functools
import hashlib
import json
import time

from ..errors import BadRequest
from ..limits import arguments_text
from ..request import Calls, Chunk, FinishReason, GenRequest, Qos, SamplingParams, TokenLogprob, ToolCall
from ..codec import fim
from ..codec.tools import new_call_id
from .. import __version__
from ..engine import for_api
from .bias import logit_bias
from .prompt import ChatPrompt, request_grammar, template_options
from .prompt import chat_prompt as build_chat_prompt
from .schema import ChatCompletionRequest, CompletionRequest, Message, Sampling

# OpenAI's defaults, and vLLM's for the extras; penalties count the whole context (docs/api.md)
DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
            "repeat_last_n": -1, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def _arguments(args: object, param: str) -> str:
    """A call's arguments as JSON text (an object as json.dumps writes it), within the nesting limit."""
    text = arguments_text(args, param)
    return text if isinstance(args, str) else json.dumps(args)


def render_messages(messages: list[Message]) -> list[dict]:
    out: list[dict] = []
    for i, m in enumerate(messages):
        if isinstance(m.content, list):
            texts = []
            for part in m.content:
                if part.type != "text":
                    raise BadRequest(f"content parts of type '{part.type}' are not supported: "
                                     f"this model takes text only", param=f"messages.{i}.content")
                texts.append(part.text)  # type: ignore[union-attr]
            content = "".join(texts)
        else:
            content = m.content or ""
        role = "system" if m.role == "developer" else m.role
        msg: dict = {"role": role, "content": content}
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id or new_call_id(), "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments, f"messages.{i}.tool_calls")}}
                for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def chat_prompt(engine, body: ChatCompletionRequest) -> ChatPrompt:
    """The prompt's session events (a Message per message, the opener), its tokens, how
    to split the output, and the grammar (tool_choice required / response_format)."""
    return build_chat_prompt(engine, render_messages(body.messages), tools=body.tools, tool_choice=body.tool_choice,
                             grammar=request_grammar(body.grammar, body.json_schema, body.response_format),
                             template_kwargs=template_options(body.chat_template_kwargs, body.reasoning_effort),
                             parallel_tool_calls=body.parallel_tool_calls, continue_final=continues(body))


def continues(body: ChatCompletionRequest) -> bool:
    """Does the reply continue the final message? vLLM's continue_final_message says so (not
    with add_generation_prompt, which opens a new turn); unsaid, a final assistant message
    with text is the reply's start, as llama-server prefills it."""
    if body.continue_final_message and body.add_generation_prompt:
        raise BadRequest("continue_final_message and add_generation_prompt cannot both be true",
                         param="continue_final_message")
    if body.continue_final_message is not None:
        return body.continue_final_message
    last = body.messages[-1]
    prefill = last.role == "assistant" and not last.tool_calls and body.add_generation_prompt is not True \
        and bool(last.content)
    if prefill and len(body.messages) > 1 and body.messages[-2].role == "assistant":
        raise BadRequest("Cannot have 2 or more assistant messages at the end of the list", param="messages")
    return prefill


def completion_prompt(engine, body: CompletionRequest) -> list[int]:
    p = body.prompt
    if isinstance(p, list):
        if len(p) != 1 and (not p or not isinstance(p[0], int)):
            raise BadRequest("one prompt per request is supported", param="prompt")
        if isinstance(p[0], int):
            p = list(p)  # type: ignore[arg-type]
        elif isinstance(p[0], list):
            p = [int(t) for t in p[0]]
        else:
            p = p[0]
    if body.suffix is not None:  # fill in the middle: the prompt is the text before the gap
        return fim.fill(engine.tokenizer, p, body.suffix, "suffix", f"the model {engine.model_id}")  # type: ignore[arg-type]
    return engine.encode_prompt(p) if isinstance(p, str) else p  # type: ignore[return-value]


def gen_requests(body: Sampling, prompt: list[int], *, base_id: str, n_ctx: int, seed: int,
                 default_max: int | None, top_logprobs: int, qos: Qos,
                 max_tokens: int | None = None, grammar: str = "", channels=None,
                 tokenizer=None, defaults: dict | None = None,
                 cache: tuple[int, float] | None = None) -> list[GenRequest]:
    """One request per choice. `tokenizer`: the model's, which logit_bias ids must be in;
    `defaults`: the engine's sampling defaults (operator and model), over OpenAI's."""
    d = for_api(DEFAULTS, defaults or {})

    def get(name: str):
        v = getattr(body, name)
        return d[name] if v is None else v
    stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())  # limits.py checks them
    room = max(1, n_ctx - len(prompt))  # a prompt that fills the window is refused by the engine's check
    mt = max_tokens or body.max_tokens or (min(default_max, room) if default_max else room)
    base_seed = body.seed if body.seed is not None else seed
    bias = logit_bias(body.logit_bias, tokenizer) if body.logit_bias else ()
    reqs = []
    for i in range(body.n):
        sp = SamplingParams(
            temperature=get("temperature"), top_p=get("top_p"), top_k=int(get("top_k")), min_p=get("min_p"),
            seed=(base_seed + i) % (1 << 63), presence_penalty=get("presence_penalty"),
            frequency_penalty=get("frequency_penalty"),
            repeat_penalty=body.repetition_penalty or get("repeat_penalty"), top_logprobs=top_logprobs,
            ignore_eos=body.ignore_eos, grammar=grammar, logit_bias=bias, typical_p=get("typical_p"),
            repeat_last_n=int(get("repeat_last_n")))
        reqs.append(GenRequest(f"{base_id}-{i}", prompt, sp, mt, stops, qos, channels=channels, cache=cache,
                               progress=body.return_progress and body.stream))
    return reqs


def prompt_progress(p: tuple[int, int, int, float]) -> dict:
    """llama-server's `prompt_progress` (return_progress): the prompt's tokens, how many came
    from the cache, how many are processed (the cached ones included), milliseconds so far."""
    total, cache, processed, ms = p
    return {"total": total, "cache": cache, "processed": processed, "time_ms": ms}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _bytes(b: bytes) -> list[int]:
    return list(b)


def chat_logprobs(lps: list[TokenLogprob]) -> dict:
    return {"content": [
        {"token": lp.text.decode("utf-8", "replace"), "logprob": lp.logprob, "bytes": _bytes(lp.text),
         "top_logprobs": [{"token": t.decode("utf-8", "replace"), "logprob": v, "bytes": _bytes(t)}
                          for _, t, v in lp.top]} for lp in lps]}


def completion_logprobs(lps: list[TokenLogprob], offset: int) -> dict:
    tokens, values, tops, offsets = [], [], [], []
    for lp in lps:
        s = lp.text.decode("utf-8", "replace")
        tokens.append(s)
        values.append(lp.logprob)
        tops.append({t.decode("utf-8", "replace"): v for _, t, v in lp.top})
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}


class Choice:
    """Accumulates one choice's chunks for a non-streaming response."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.finish: FinishReason | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.last: Chunk | None = None
        self.error: Exception | None = None
        self.reasoning: list[str] = []
        self._calls = Calls()

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self._calls.done

    def add(self, c: Chunk) -> None:
        self.text.append(c.text)
        self.reasoning.append(c.reasoning)
        self._calls.add(c.calls)
        self.logprobs.extend(c.logprobs)
        if c.finish is not None:
            self.finish = c.finish
            self.prompt_tokens, self.completion_tokens = c.prompt_tokens, c.completion_tokens
            self.cached_tokens = c.cached_tokens
            self.last = c
            self.error = c.error


def finish_reason(finish: FinishReason | None, made_calls: bool) -> str | None:
    if finish is None:
        return None
    if made_calls and finish in (FinishReason.END_OF_TURN, FinishReason.STOP_SEQUENCE, FinishReason.GRAMMAR):
        return "tool_calls"
    return finish.openai


def chat_message(c: Choice) -> dict:
    msg: dict = {"role": "assistant", "content": "".join(c.text)}
    if c.tool_calls:
        msg["tool_calls"] = [t.to_openai() for t in c.tool_calls]
        msg["content"] = msg["content"] or None
    reasoning = "".join(c.reasoning)
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


@functools.cache
def fingerprint(model: str) -> str:
    """system_fingerprint: the same for one model on one build (with the seed, what decides
    the output, as OpenAI means it)."""
    return "fp_" + hashlib.sha256(f"superfluid {__version__} {model}".encode()).hexdigest()[:12]


def chat_response(rid: str, model: str, choices: list[Choice], want_logprobs: bool) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": i, "message": chat_message(c),
                     "logprobs": chat_logprobs(c.logprobs) if want_logprobs else None,
                     "finish_reason": finish_reason(c.finish, bool(c.tool_calls))}
                    for i, c in enumerate(choices)],
        "usage": usage(choices[0].prompt_tokens, sum(c.completion_tokens for c in choices),
                       choices[0].cached_tokens),
        "system_fingerprint": fingerprint(model),
    }


def completion_response(rid: str, model: str, choices: list[Choice], want_logprobs: bool) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": i, "text": "".join(c.text),
                     "logprobs": completion_logprobs(c.logprobs, 0) if want_logprobs else None,
                     "finish_reason": c.finish.openai if c.finish else None}
                    for i, c in enumerate(choices)],
        "usage": usage(choices[0].prompt_tokens, sum(c.completion_tokens for c in choices),
                       choices[0].cached_tokens),
    }


def chat_chunk(rid: str, model: str, created: int, index: int, delta: dict,
               finish: str | None = None, logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": fingerprint(model),
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                         "finish_reason": finish}]}


def completion_chunk(rid: str, model: str, created: int, index: int, text: str,
                     finish: str | None = None, logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": index, "text": text, "logprobs": logprobs,
                         "finish_reason": finish}]}
