"""Ollama's `options` → the canonical sampling params, with Ollama's names and defaults; and
the request fields around them: `think` (levels too), `logprobs` / `top_logprobs`, `template`.

A key Ollama does not know is a 400 naming `options.<key>` (a typo'd option silently doing
nothing is worse). The valid names are Ollama's Options and Runner structs (api/types.go);
the runner's own settings (num_ctx, num_gpu, ...) and samplers Ollama has since removed
(mirostat, tfs_z, ...) that older clients still send are accepted and ignored."""

from __future__ import annotations

from ..errors import BadRequest
from ..limits import MAX_REPEAT_LAST_N, MAX_STOPS, MAX_TOP_LOGPROBS
from ..request import SamplingParams, TokenLogprob
from ..engine import for_api

# Ollama's documented defaults (api/types.go DefaultOptions), but repeat_penalty 1.0, not 1.1:
# greedy answers stay the same on every API (an operator wants Ollama's: --repeat-penalty 1.1)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "typical_p": 1.0,
            "repeat_penalty": 1.0, "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0}
SAMPLING = ("num_predict", "seed", "stop", "temperature", "top_k", "top_p", "min_p", "typical_p",
            "repeat_last_n", "repeat_penalty", "presence_penalty", "frequency_penalty")
IGNORED = ("num_keep", "num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread",
           # removed from Ollama; older clients (Open WebUI, LangChain) still send them
           "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta", "penalize_newline", "numa", "low_vram",
           "f16_kv", "logits_all", "vocab_only", "use_mlock", "num_gqa")
KNOWN = frozenset(SAMPLING + IGNORED)
THINK_LEVELS = ("low", "medium", "high")


def _num(opts: dict, key: str, kind, default=None):
    v = opts.get(key, default)
    if v is None:
        return None
    if kind is int and isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, (int, float) if kind is float else int):
        raise BadRequest(f"options.{key} must be a number", param=f"options.{key}")
    return kind(v)


def _check(ok: bool, key: str, rule: str) -> None:
    if not ok:
        raise BadRequest(f"options.{key} must be {rule}", param=f"options.{key}")


def sampling(opts, seed: int, defaults: dict | None = None) -> tuple[SamplingParams, int | None, tuple[str, ...]]:
    """(params, num_predict or None, stop strings) from Ollama options; `seed`: the request's
    random seed when options.seed is not given; `defaults`: the engine's sampling defaults
    (operator and model), over Ollama's."""
    d = for_api(DEFAULTS, defaults or {})
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise BadRequest("options must be an object", param="options")
    unknown = sorted(k for k in opts if k not in KNOWN)
    if unknown:
        key = f"options.{unknown[0][:64]}"
        raise BadRequest(f"invalid option provided: {key}", param=key)
    stop = opts.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOPS or not all(isinstance(s, str) for s in stop):
        raise BadRequest(f"options.stop must be a list of at most {MAX_STOPS} strings", param="options.stop")
    n = _num(opts, "num_predict", int)
    opt_seed = _num(opts, "seed", int)
    get = {k: _num(opts, k, float, d[k]) for k in
           ("temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty", "frequency_penalty")}
    top_k = _num(opts, "top_k", int, int(d["top_k"]))
    last_n = _num(opts, "repeat_last_n", int, int(d["repeat_last_n"]))
    _check(get["temperature"] >= 0, "temperature", ">= 0")
    _check(0 < get["top_p"] <= 1, "top_p", "in (0, 1]")
    _check(0 <= get["min_p"] <= 1, "min_p", "in [0, 1]")
    _check(0 < get["typical_p"] <= 1, "typical_p", "in (0, 1]")
    _check(top_k >= 0, "top_k", ">= 0")
    _check(0 < get["repeat_penalty"] <= 100, "repeat_penalty", "in (0, 100]")
    for k in ("presence_penalty", "frequency_penalty"):
        _check(-100 <= get[k] <= 100, k, "in [-100, 100]")
    _check(-1 <= last_n <= MAX_REPEAT_LAST_N, "repeat_last_n", f"in [-1, {MAX_REPEAT_LAST_N}] (-1: the whole context)")
    sp = SamplingParams(
        temperature=get["temperature"], top_p=get["top_p"], top_k=top_k, min_p=get["min_p"],
        seed=(opt_seed if opt_seed is not None else seed) % (1 << 63),
        presence_penalty=get["presence_penalty"], frequency_penalty=get["frequency_penalty"],
        repeat_penalty=get["repeat_penalty"], typical_p=get["typical_p"], repeat_last_n=last_n)
    return sp, (n if n is not None and n >= 0 else None), tuple(stop)


def think_options(think: object) -> dict:
    """Ollama's `think`: true/false, or a level ("low", "medium", "high") that models with
    reasoning levels (gpt-oss) take as their template's reasoning_effort."""
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    if think in THINK_LEVELS:
        return {"enable_thinking": True, "reasoning_effort": think}
    raise BadRequest('think must be true, false, "low", "medium" or "high"', param="think")


def top_logprobs(body: dict) -> int:
    """SamplingParams.top_logprobs from Ollama's `logprobs` (bool) and `top_logprobs` (0-20)."""
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if want is not None and not isinstance(want, bool):
        raise BadRequest("logprobs must be true or false", param="logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise BadRequest(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")
    return (top or 0) if want else -1


def logprobs_out(lps: list[TokenLogprob]) -> list[dict]:
    """Ollama's logprobs: per token {token, logprob, bytes, top_logprobs}."""
    def one(text: bytes, logprob: float) -> dict:
        return {"token": text.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(text)}
    return [{**one(lp.text, lp.logprob), "top_logprobs": [one(t, v) for _, t, v in lp.top]} for lp in lps]


def refuse_template(body: dict) -> None:
    """Ollama's `template` (a Go template replacing the model's): refused, not ignored."""
    if body.get("template") not in (None, ""):
        raise BadRequest("template (a Go template) is not supported: the model's own jinja chat template is used; "
                         "send raw: true with a prompt you formatted, or serve with --chat-template-file",
                         param="template")
