"""Shared by the transformers runtime and stage tests: the embedded GGUF converted once per
test session, a reference `model.generate`, and the chat prompt the daemon would render."""

from __future__ import annotations

import functools
from pathlib import Path

from ..scratch import scratch

HOME = Path(scratch("superfluid-hf-home-"))  # one conversion per test session (half a GB)


@functools.cache
def gguf() -> str:
    from superfluid.runtime.registry import embedded_model

    return embedded_model().path


@functools.cache
def folder() -> str:
    from superfluid.runtime.hf_convert import hf_dir

    return str(hf_dir(gguf(), cache=HOME / "models"))


@functools.cache
def _reference():
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(folder(), attn_implementation="sdpa", dtype=torch.float32)
    return m.eval()


EOG = (0, 2, 4)


def generate(tokens: list[int], n: int) -> list[int]:
    """Plain greedy `model.generate` on the converted weights; stops after an end-of-generation token."""
    return list(_generate(tuple(tokens), n))


@functools.cache  # greedy on fixed weights: the same prompt gives the same tokens, and tests ask again
def _generate(tokens: tuple[int, ...], n: int) -> tuple[int, ...]:
    import torch

    with torch.inference_mode():
        out = _reference().generate(torch.tensor([tokens]), max_new_tokens=n, do_sample=False,
                                    eos_token_id=list(EOG), pad_token_id=EOG[0])
    return tuple(out[0, len(tokens):].tolist())


@functools.cache
def tokenizer():
    """The embedded model's tokenizer, read from the GGUF once per test session."""
    from superfluid.codec.tokenizer import Tokenizer

    return Tokenizer(gguf())


def chat_prompt(content: str) -> list[int]:
    from superfluid.codec.template import ChatTemplate

    tok = tokenizer()
    text = ChatTemplate(tok.chat_template).render([{"role": "user", "content": content}])
    return tok.encode_prompt(text)


def until_eog(tokens: list[int]) -> list[int]:
    """`tokens` up to and including the first end-of-generation token (as generate stops)."""
    for i, t in enumerate(tokens):
        if t in EOG:
            return tokens[:i + 1]
    return tokens


@functools.cache
def full_folder() -> str:
    """A complete Hugging Face folder: the converted weights plus tokenizer files (written by
    transformers from the GGUF, once per test session), as a user would download one."""
    from transformers import AutoTokenizer

    out = HOME / "SmolLM2-135M-Instruct-hf"
    out.mkdir(exist_ok=True)
    for f in Path(folder()).iterdir():
        if f.suffix in (".json", ".safetensors") and f.name != "superfluid.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f)
    g = Path(gguf())
    AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name).save_pretrained(str(out))
    return str(out)
