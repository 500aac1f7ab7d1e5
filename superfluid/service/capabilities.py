"""What a loaded model can do: one record that every API reports in its own shape (issue 34):
OpenAI's /v1/models, Ollama's /api/show and /api/tags, llama-server's /props.

Each capability is True, or a string saying why not. A request that needs one the model lacks
is refused with a 400 before anything is stored, where the request is read: an image part
(each API's parser), a FIM request (codec/fim.tokens_of), a generation on an embedding model
(the engine's check), an embedding or rerank request on a model that cannot (its runtime)."""

from __future__ import annotations

from typing import Any

from ..codec import fim
from ..errors import BadRequest

CAPABILITIES = ("chat", "completion", "tools", "reasoning", "fim", "embeddings", "rerank", "vision",
                "structured_output")
NO_VISION = "this server takes text only: no image input"

# llama.cpp's llama_ftype (GGUF general.file_type): the weights' quantization, as Ollama names it
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
              26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
              36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}


def capabilities(eng: Any) -> dict[str, bool | str]:
    """The engine's capabilities: True, or why not."""
    kind = eng.model_kind
    gen = kind == "generate"
    not_gen = f"an {kind} model: it does not generate text"
    tok = eng.tokenizer
    caps: dict[str, bool | str] = {"chat": True if gen else not_gen, "completion": True if gen else not_gen}
    caps["tools"] = True if gen else not_gen
    if not gen:
        caps["reasoning"] = not_gen
    elif eng.reasoning or eng.tool_format.own_reasoning:
        caps["reasoning"] = True
    else:
        caps["reasoning"] = "the model's template marks no reasoning"
    if not gen:
        caps["fim"] = not_gen
    else:
        try:
            fim.tokens_of(tok, "prompt")
            caps["fim"] = True
        except BadRequest:
            caps["fim"] = "the model has no fill-in-the-middle tokens"
    if kind == "embedding" or (gen and eng.cfg.runtime == "llamacpp"):
        caps["embeddings"] = True
    elif kind == "cross-encoder":
        caps["embeddings"] = "a cross-encoder: it scores (query, document) pairs (/v1/rerank)"
    else:
        caps["embeddings"] = f"the {eng.cfg.runtime} runtime does not embed with a generative model"
    caps["rerank"] = True if kind == "cross-encoder" else "not a cross-encoder: it cannot score pairs"
    caps["vision"] = NO_VISION
    caps["structured_output"] = True if gen else not_gen
    return caps


def quantization(eng: Any) -> str:
    """The weights' quantization (GGUF general.file_type), '' when unknown."""
    raw = eng.tokenizer.meta("general.file_type")
    try:
        return FILE_TYPES.get(int(raw or ""), "")
    except ValueError:
        return ""


def record(eng: Any) -> dict[str, Any]:
    """The model's record: its capabilities (and tool dialect), window, output limit and
    recommended sampling (the GGUF's general.sampling.*, under the operator's flags)."""
    caps = capabilities(eng)
    out: dict[str, Any] = {"capabilities": caps, "context_window": eng.n_ctx,
                           "max_output_tokens": eng.cfg.max_output or eng.n_ctx,
                           "sampling": dict(eng.sampling_defaults), "quantization": quantization(eng)}
    if caps["tools"] is True:
        out["tool_dialect"] = eng.tool_format.name or "template"
    info = getattr(eng, "info", None)
    if info is not None and caps["chat"] is True:
        # how a shared prefix is reused: "kv" (cut anywhere), "checkpoints" (a recurrent state,
        # restored where it was saved: docs/models.md), and the memory that decides it
        out["prefix_cache"] = info.prefix_cache
        out["memory"] = info.memory
    off = getattr(eng, "offload", None)
    if off is not None:  # where its layers are: the GPU's share (runtime/offload.py)
        out["device"] = off.to_json()
    return out


def ollama_names(caps: dict[str, bool | str]) -> list[str]:
    """Ollama's capability list (/api/show): completion, tools, thinking, insert, embedding, vision."""
    names = {"completion": "completion", "tools": "tools", "reasoning": "thinking", "fim": "insert",
             "vision": "vision"}
    out = [o for c, o in names.items() if caps.get(c) is True]
    if caps.get("embeddings") is True and caps.get("completion") is not True:
        out.append("embedding")
    return out

