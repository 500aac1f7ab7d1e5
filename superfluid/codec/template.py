"""Chat templates: the model's own jinja template, rendered in a sandbox."""

from __future__ import annotations

import datetime
import json

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import BadRequest

# Used when a GGUF carries no template: plain ChatML.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> None:
    raise BadRequest(f"chat template: {message}")


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii,
                      separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos: str = "", eos: str = ""):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            undefined=jinja2.ChainableUndefined)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        self.source = source or CHATML
        self._t = env.from_string(self.source)
        self._bos, self._eos = bos, eos

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, **extra) -> str:
        try:
            return self._t.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                  bos_token=self._bos, eos_token=self._eos, **extra)
        except BadRequest:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            # a template that trips over a message it did not expect (content null where it
            # concatenates strings, a missing key) is the request's shape, not a server fault
            raise BadRequest(f"chat template failed: {type(e).__name__}: {e}") from e
