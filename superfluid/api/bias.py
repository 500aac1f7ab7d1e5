"""`logit_bias` in the shapes the APIs send it → the canonical (token id, bias) pairs of
SamplingParams, checked once: at most MAX_LOGIT_BIAS entries, biases in [-100, 100], ids in
the model's vocabulary. OpenAI sends {"id": bias}; llama-server's /completion also takes
[[id, bias], ...], text instead of an id (every token of the text gets the bias) and `false`
for a ban. The sampler adds the bias to the logits before any mask or draw."""

from __future__ import annotations

from ..errors import BadRequest
from ..limits import MAX_BIAS, MAX_LOGIT_BIAS

BAN = -MAX_BIAS  # the sampler turns -100 into -inf


def _bias(v: object, param: str) -> float:
    if v is False:
        return BAN
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not -MAX_BIAS <= v <= MAX_BIAS:
        raise BadRequest(f"{param}: each bias is a number in [-100, 100] (or false: a ban)", param=param)
    return float(v)


def _ids(key: object, tokenizer, param: str, text_keys: bool) -> list[int]:
    if isinstance(key, str):
        text = key
        try:
            key = int(text)
        except ValueError:
            if not text_keys or len(text) > 256:
                raise BadRequest(f"{param}: keys are token ids (or, on /completion, text of at most 256 "
                                 f"characters), not {text[:40]!r}", param=param) from None
            return tokenizer.encode(text, parse_special=False)
    if isinstance(key, bool) or not isinstance(key, int) or not tokenizer.valid(key):
        raise BadRequest(f"{param}: token id {key!r} is outside the vocabulary", param=param)
    return [key]


def logit_bias(value: object, tokenizer, *, text_keys: bool = False,
               param: str = "logit_bias") -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs, one per token (a later entry for the same token wins).
    `text_keys`: a key that is not an id is text (llama-server)."""
    if value is None:
        return ()
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list) and text_keys:
        if not all(isinstance(e, list) and len(e) == 2 for e in value):
            raise BadRequest(f"{param} is a list of [token id or text, bias] pairs or an object", param=param)
        items = [(e[0], e[1]) for e in value]
    else:
        raise BadRequest(f"{param} must be an object of token id → bias", param=param)
    if len(items) > MAX_LOGIT_BIAS:
        raise BadRequest(f"{param} may have at most {MAX_LOGIT_BIAS} entries, not {len(items)}", param=param)
    out: dict[int, float] = {}
    for key, v in items:
        b = _bias(v, param)
        for t in _ids(key, tokenizer, param, text_keys):
            out[t] = b
    if len(out) > MAX_LOGIT_BIAS:
        raise BadRequest(f"{param} covers {len(out)} tokens; at most {MAX_LOGIT_BIAS}", param=param)
    return tuple(sorted(out.items()))
