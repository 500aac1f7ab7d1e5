"""A FIM-capable copy of the embedded model for the infill tests.

SmolLM2's vocabulary has no fill-in-the-middle tokens (its specials are <|endoftext|>,
<|im_start|>, <|im_end|>, <repo_name>, <reponame>, <file_sep>, ... <jupyter_*>, <empty_output>).
This copy renames four of its unused control tokens to StarCoder's FIM names, as a FIM model's
vocabulary has them; weights and everything else are the embedded model's, byte for byte. The
model was not trained on them, so what it writes between prefix and suffix is no measure of
quality: the tests check the mechanics (the prompt, the routes, stops, cancelling)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ..scratch import scratch

RENAMED = {11: "<fim_prefix>", 12: "<fim_middle>", 13: "<fim_suffix>", 14: "<fim_pad>"}  # the model's <jupyter_*>
FIM_PRE, FIM_MID, FIM_SUF, FIM_PAD = 11, 12, 13, 14
HOME = Path(scratch("superfluid-fim-"))


@functools.cache
def fim_gguf() -> str:
    import gguf

    from superfluid.runtime.registry import embedded_model

    src = embedded_model().path
    out = HOME / "SmolLM2-135M-FIM.gguf"
    r = gguf.GGUFReader(src)
    arch = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(out), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = f.contents()
        if name == "tokenizer.ggml.tokens":
            value = [RENAMED.get(i, t) for i, t in enumerate(value)]
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, vtype)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(out)
