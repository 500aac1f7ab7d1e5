"""GGUF -> a Hugging Face folder (config.json, generation_config.json, model.safetensors).

transformers can load a GGUF itself (`from_pretrained(gguf_file=...)`), but it takes minutes
here and the result cannot be saved (NOTES.md). Reading the tensors with `gguf.GGUFReader` and
dequantizing them with `gguf.quants.dequantize` takes seconds and needs only gguf, numpy and
safetensors. Two things differ between the layouts: llama.cpp's converter permutes the rows of
Llama's Q and K projections (rotary pairs interleaved), so we undo it the way transformers' GGUF
loader does; and a GGUF without `output.weight` ties the output head to the embedding.

The folder is cached under `<home>/models/<first 16 hex of the GGUF's sha256>/`, written into a
temporary directory and renamed into place, so a crash or a concurrent conversion never leaves
a half-written folder that looks finished."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..config import home
from ..errors import ModelLoadError

VERSION = 1  # bump when the output changes: cached folders of another version are rebuilt
MARKER = "superfluid.json"

_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def is_hf_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def file_key(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:16]


def hf_dir(source: str | os.PathLike, *, cache: str | os.PathLike | None = None) -> Path:
    """An HF folder for `source`: the folder itself if it is one, else the cached conversion
    of the GGUF (converted now if missing)."""
    if is_hf_dir(source):
        return Path(source)
    src = Path(source)
    if not src.is_file():
        raise ModelLoadError(f"not a GGUF file or a Hugging Face folder: {source}")
    root = Path(cache) if cache is not None else home() / "models"
    out = root / file_key(src)
    if _current(out):
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=root))
    try:
        os.chmod(tmp, 0o755)
        convert(src, tmp, key=out.name)
        if out.exists():  # an older version, or a folder another process just finished
            if _current(out):
                return out
            shutil.rmtree(out, ignore_errors=True)
        try:
            os.rename(tmp, out)
        except OSError:
            if not _current(out):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _current(out: Path) -> bool:
    try:
        return json.loads((out / MARKER).read_text()).get("version") == VERSION
    except (OSError, ValueError):
        return False


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None or not f.data:
        return default
    return f.contents()


def _config(reader, tied: bool) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"the transformers runtime converts only Llama GGUFs, not {arch!r}")
    a = f"{arch}."
    n_head = int(_field(reader, a + "attention.head_count"))
    hidden = int(_field(reader, a + "embedding_length"))
    head_dim = int(_field(reader, a + "rope.dimension_count", hidden // n_head))
    rope = {"rope_type": "default", "rope_theta": float(_field(reader, a + "rope.freq_base", 10000.0))}
    scaling = _field(reader, a + "rope.scaling.type")
    if scaling == "linear":
        rope = {**rope, "rope_type": "linear", "factor": float(_field(reader, a + "rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise ModelLoadError(f"rope scaling {scaling!r} is not supported by the GGUF conversion")
    n_vocab = _field(reader, a + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(n_vocab),
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, a + "feed_forward_length")),
        "num_hidden_layers": int(_field(reader, a + "block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(_field(reader, a + "attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(_field(reader, a + "context_length", 2048)),
        "rms_norm_eps": float(_field(reader, a + "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": rope["rope_theta"],
        "rope_parameters": rope,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    if rope["rope_type"] == "linear":
        cfg["rope_scaling"] = {"type": "linear", "factor": rope["factor"]}
    return cfg


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.py `permute`): within each
    head, rows were reordered from [half0 | half1] to interleaved pairs."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def hf_name(gguf_name: str) -> str:
    base, _, kind = gguf_name.rpartition(".")
    if base in _GLOBAL:
        return f"{_GLOBAL[base]}.{kind}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{kind}"
    raise ModelLoadError(f"unexpected tensor {gguf_name!r} in the GGUF")


class GgufWeights:
    """A GGUF read in place (memory-mapped) as Hugging Face tensors: its config, its tensor
    names, and one tensor at a time dequantized to float32 on demand. A pipeline stage loads
    only its layers this way, never the whole model in float32. Only the tensors' entries (views
    of the map), the config and the chat template are kept, not the reader's other fields (the
    vocabulary alone is ~150k small arrays), so a process can keep one (`gguf_weights`)."""

    def __init__(self, gguf_path: str | os.PathLike):
        import gguf

        self.path = str(gguf_path)
        reader = gguf.GGUFReader(self.path)
        self._tensors = {hf_name(t.name): t for t in reader.tensors}
        self.config = _config(reader, tied="lm_head.weight" not in self._tensors)
        self._chat_template = _field(reader, "tokenizer.chat_template")

    def names(self) -> set[str]:
        return set(self._tensors)

    def get(self, name: str) -> np.ndarray:
        from gguf.quants import dequantize

        t = self._tensors[name]
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists ne0 (the row length) first
        if t.name.endswith(".attn_q.weight"):
            w = unpermute(w, self.config["num_attention_heads"])
        elif t.name.endswith(".attn_k.weight"):
            w = unpermute(w, self.config["num_key_value_heads"])
        w = np.ascontiguousarray(w)
        return w if w.flags.writeable else w.copy()  # float32 tensors come straight from the read-only map

    def chat_template(self) -> str | None:
        return self._chat_template


def gguf_weights(gguf_path: str | os.PathLike) -> GgufWeights:
    """The GGUF's `GgufWeights`, read once per process while the file is unchanged: parsing
    its header takes seconds (gguf's reader builds every metadata field, the vocabulary
    included), and a stage node loads a layer range for each head that connects."""
    st = os.stat(gguf_path)
    return _weights(str(gguf_path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=2)
def _weights(path: str, mtime_ns: int, size: int) -> GgufWeights:
    return GgufWeights(path)


def convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *, key: str | None = None) -> None:
    """Write config.json, generation_config.json and model.safetensors (float32) for the GGUF."""
    from safetensors.numpy import save_file

    src = GgufWeights(gguf_path)
    cfg = src.config
    tensors = {name: src.get(name) for name in src.names()}
    out = Path(out_dir)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
           "pad_token_id": cfg["pad_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    chat_template = src.chat_template()
    if chat_template:
        (out / "chat_template.jinja").write_text(chat_template)
    (out / MARKER).write_text(json.dumps({"version": VERSION, "source": str(Path(gguf_path).resolve()),
                                          "sha256_16": key or file_key(gguf_path)}))
