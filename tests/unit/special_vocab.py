"""A vocabulary whose tool-call and reasoning markers are single special tokens, as real GGUF
models have them (Qwen's <tool_call>, Llama 3's <|python_tag|>, Mistral's [TOOL_CALLS], ...):
the embedded model's vocabulary, read and written back by the gguf package with the markers
appended as tokens of the types their models give them. Only the metadata is written (no
tensors): llama.cpp loads it vocab-only, as the daemon's tokenizer and the runtime's grammar
tokenizer (runtime/gguf_vocab.py) do."""

from __future__ import annotations

import functools
from pathlib import Path

from ..scratch import scratch

CONTROL, USER_DEFINED = 3, 4  # gguf token types
# marker -> its token type: added tokens shaped <...> are USER_DEFINED in their models' GGUFs
# (llguidance holds them special as well), the others CONTROL
MARKERS = {
    "<tool_call>": USER_DEFINED, "</tool_call>": USER_DEFINED,  # Qwen 2.5 / 3, Hermes
    "<think>": USER_DEFINED, "</think>": USER_DEFINED,
    "[TOOL_CALLS]": CONTROL,  # Mistral
    "<|python_tag|>": CONTROL,  # Llama 3
    "<|tool_call|>": CONTROL,  # Granite
    "<｜tool▁calls▁begin｜>": USER_DEFINED, "<｜tool▁calls▁end｜>": USER_DEFINED,  # DeepSeek
    "<｜tool▁call▁begin｜>": USER_DEFINED, "<｜tool▁call▁end｜>": USER_DEFINED, "<｜tool▁sep｜>": USER_DEFINED,
    "<|channel|>": CONTROL, "<|message|>": CONTROL, "<|constrain|>": CONTROL,  # Harmony
    "<|start|>": CONTROL, "<|end|>": CONTROL, "<|call|>": CONTROL, "<|return|>": CONTROL,
    "[NOT_SPECIAL]": USER_DEFINED,  # an added token llguidance does not hold special: text
}


@functools.cache
def special_gguf() -> str:
    import gguf

    from superfluid.runtime.registry import embedded_model

    out = Path(scratch("superfluid-special-")) / "vocab.gguf"
    r = gguf.GGUFReader(embedded_model().path)
    w = gguf.GGUFWriter(str(out), str(r.fields["general.architecture"].contents()))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = f.contents()
        if name == "tokenizer.ggml.tokens":
            value = value + list(MARKERS)
        elif name == "tokenizer.ggml.token_type":
            value = value + list(MARKERS.values())
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, f.types[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return str(out)
