"""llama-server's /completion body → the canonical request: its option names and defaults
(temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, n_predict -1), checked field by field
(a 400 names the field); logit_bias in its three shapes (api/bias.py). Options for samplers
we do not have (mirostat, DRY, XTC, dynamic temperature) and for its slot and cache
machinery are accepted and ignored; docs/migrating.md lists them."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadRequest, ContextLengthExceeded
from ..limits import MAX_PROMPT_WRAPS, MAX_REPEAT_LAST_N, MAX_STOPS, MAX_TOP_LOGPROBS
from ..request import SamplingParams
from ..engine import for_api
from .bias import logit_bias
from .prompt import request_grammar
from .schema import number_in

RANDOM_SEEDS = (-1, 0xFFFFFFFF)  # llama-server's "pick a random seed" (LLAMA_DEFAULT_SEED)
SAMPLER_CHARS = {"k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature", "y": "typ_p", "d": "dry",
                 "x": "xtc", "e": "penalties", "s": "top_n_sigma"}
DEFAULT_SAMPLERS = ("penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
MAX_SAMPLERS = 32
MAX_RESPONSE_FIELDS = 64
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "typical_p": 1.0, "repeat_last_n": 64}


@dataclass
class Options:
    n_predict: int  # -1: until the window is full
    stream: bool
    stop: tuple[str, ...]
    sampling: SamplingParams  # seed 0 when `seed` is None
    seed: int | None  # None: a random one
    samplers: tuple[str, ...]
    n_probs: int
    return_tokens: bool
    response_fields: tuple[str, ...]
    return_progress: bool = False  # stream prompt_progress pieces while the prompt prefills


def flag(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"{key} must be true or false", param=key)
    return v


def integer(body: dict, key: str, lo: int, hi: int, default: int) -> int:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest(f"{key} must be an integer in [{lo}, {hi}]", param=key)
    return v


def _strings(body: dict, key: str, most: int, longest: int = 256) -> tuple[str, ...]:
    v = body.get(key)
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or len(items) > most or not all(isinstance(s, str) for s in items):
        raise BadRequest(f"{key} must be a string or a list of at most {most} strings", param=key)
    if any(len(s) > longest for s in items):
        raise BadRequest(f"{key}: each entry is at most {longest} characters", param=key)
    return tuple(items)


def _samplers(body: dict) -> tuple[str, ...]:
    v = body.get("samplers")
    if isinstance(v, str):  # llama-server also takes them as letters ("kpmt")
        if len(v) > MAX_SAMPLERS or any(ch not in SAMPLER_CHARS for ch in v):
            raise BadRequest(f"samplers as letters: at most {MAX_SAMPLERS} of {''.join(SAMPLER_CHARS)}",
                             param="samplers")
        return tuple(SAMPLER_CHARS[ch] for ch in v)
    return _strings(body, "samplers", MAX_SAMPLERS, 32) if v is not None else DEFAULT_SAMPLERS


def options(body: dict, tokenizer=None, defaults: dict | None = None) -> Options:
    """`tokenizer`: the model's, to check (and tokenize) logit_bias keys against; `defaults`:
    the engine's sampling defaults (operator and model), over llama-server's."""
    d = for_api(DEFAULTS, defaults or {})
    n_predict = integer(body, "n_predict", -1, 1 << 30, integer(body, "max_tokens", -1, 1 << 30, -1))
    samplers = _samplers(body)
    temperature = max(0.0, number_in(body, "temperature", -1e6, 100.0, d["temperature"], allow_null=True))
    top_k = max(0, integer(body, "top_k", -1 << 31, 1 << 31, int(d["top_k"])))
    top_p = number_in(body, "top_p", 0.0, 1.0, d["top_p"], allow_null=True)
    min_p = number_in(body, "min_p", 0.0, 1.0, d["min_p"], allow_null=True)
    # a sampler left out of `samplers` is not used (llama-server's rule); their order is ours
    top_k = top_k if "top_k" in samplers else 0
    top_p = top_p if "top_p" in samplers else 1.0
    min_p = min_p if "min_p" in samplers else 0.0
    if top_p <= 0.0:  # nothing but the likeliest token survives
        temperature, top_p = 0.0, 1.0
    repeat = number_in(body, "repeat_penalty", 0.0, 100.0, d["repeat_penalty"], allow_null=True) or 1.0
    typical = number_in(body, "typical_p", 0.0, 1.0, d["typical_p"], allow_null=True) if "typ_p" in samplers else 1.0
    last_n = integer(body, "repeat_last_n", -1, MAX_REPEAT_LAST_N, int(d["repeat_last_n"]))
    seed = integer(body, "seed", -1, (1 << 64) - 1, -1)
    n_probs = integer(body, "n_probs", 0, MAX_TOP_LOGPROBS, 0)
    if integer(body, "n_cmpl", 1, 16, 1) > 1:
        raise BadRequest("one completion per request: n_cmpl must be 1", param="n_cmpl")
    bias = body.get("logit_bias")
    if bias not in (None, [], {}) and tokenizer is None:
        raise BadRequest("logit_bias needs the model's vocabulary", param="logit_bias")
    bias = logit_bias(bias, tokenizer, text_keys=True) if tokenizer is not None else ()
    sp = SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=0,
        presence_penalty=number_in(body, "presence_penalty", -100.0, 100.0, d["presence_penalty"], allow_null=True),
        frequency_penalty=number_in(body, "frequency_penalty", -100.0, 100.0, d["frequency_penalty"], allow_null=True),
        repeat_penalty=repeat, top_logprobs=n_probs if n_probs > 0 else -1,
        ignore_eos=flag(body, "ignore_eos"), logit_bias=bias,
        grammar=request_grammar(body.get("grammar"), body.get("json_schema"), body.get("response_format")),
        typical_p=typical or 1.0, repeat_last_n=last_n, post_sampling=flag(body, "post_sampling_probs"))
    return Options(n_predict=n_predict, stream=flag(body, "stream"), stop=_strings(body, "stop", MAX_STOPS),
                   sampling=sp, seed=None if seed in RANDOM_SEEDS else seed % (1 << 63), samplers=samplers,
                   n_probs=n_probs, return_tokens=flag(body, "return_tokens"),
                   response_fields=_strings(body, "response_fields", MAX_RESPONSE_FIELDS),
                   return_progress=flag(body, "return_progress"))


def prompt_tokens(eng, prompt: object) -> list[int]:
    """llama-server's prompt shapes for one prompt: a string, token ids, token ids and strings
    mixed, or {"prompt_string": ...}, each alone in a list or not. A string first gets the
    model's BOS (as llama-server). One wrapped in more than MAX_PROMPT_WRAPS lists and objects
    is refused (unwrapping it without a bound was a recursion error: an untyped 500)."""
    for _ in range(MAX_PROMPT_WRAPS + 1):
        if isinstance(prompt, dict):
            if prompt.get("multimodal_data"):
                raise BadRequest("this model takes text only: multimodal_data is not supported", param="prompt")
            prompt = prompt.get("prompt_string")
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list, dict)):
            prompt = prompt[0]
        else:
            break
    else:
        raise BadRequest(f"prompt nests deeper than {MAX_PROMPT_WRAPS} levels of lists and objects", param="prompt")
    if isinstance(prompt, str):
        return eng.encode_prompt(prompt)
    if not isinstance(prompt, list) or not prompt or all(isinstance(p, str) for p in prompt):
        raise BadRequest("prompt must be one string, or one list of token ids and strings (one prompt "
                         "per request)", param="prompt")
    out: list[int] = []
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            out += eng.encode_prompt(p) if i == 0 else eng.tokenizer.encode(p, parse_special=True)
        elif isinstance(p, int) and not isinstance(p, bool):
            if not eng.tokenizer.valid(p):  # before anything looks the id up
                raise BadRequest(f"prompt: token id {p} is outside the vocabulary", param="prompt")
            out.append(p)
        else:
            raise BadRequest("prompt: a list holds token ids and strings only (one prompt per request)",
                             param="prompt")
    return out


def budget(n_predict: int, prompt: int, n_ctx: int) -> int:
    """Tokens to generate: n_predict, or until the window is full (-1, or more than fits: llama-
    server stops at the window too)."""
    if prompt >= n_ctx:
        raise ContextLengthExceeded.over(prompt, n_ctx, param="prompt")
    room = n_ctx - prompt
    return room if n_predict < 0 else min(n_predict, room)
