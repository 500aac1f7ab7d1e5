"""The transformers (PyTorch) runtime: serves a Hugging Face folder, or a GGUF converted once to
one (runtime/hf_convert.py, cached under the home).

The model is the stage [0, n_layer) of runtime/stage.py: lanes are its sessions, each with its
own K/V buffers. A lane's KV outlives `close_lane` (a prefix-cache entry); `open_lane(keep)`
truncates it; `copy_lane` clones a prefix. In `forward`, every decode run of the step (one
token) goes through ONE batched pass, with per-row positions and a mask over ragged lengths;
prefill runs go one lane at a time. Token ids are the GGUF's, so the daemon keeps tokenizing
with its GGUF vocabulary."""

from __future__ import annotations

import json

import numpy as np
import torch

from ..errors import ModelLoadError
from ..plan import Run
from .base import ModelInfo, Runtime
from .gguf_vocab import GgufVocab
from .hf_convert import hf_dir, is_hf_dir
from .rope import derive
from .stage import StageModel


class TransformersRuntime(Runtime):
    def __init__(self, path: str, *, lanes: int, n_ctx: int, threads: int, batch_tokens: int = 256,
                 dtype: str = "float32", rope: tuple[str, float, int] = ("", 0.0, 0)):
        super().__init__()
        torch.set_num_threads(threads)
        self.source = path
        self.gguf = not is_hf_dir(path)
        try:
            self.folder = hf_dir(path)
            raw = json.loads((self.folder / "config.json").read_text())
            n_layer = int(raw["num_hidden_layers"])
            # the same stretch llama.cpp would derive (runtime/rope.py); none asked: the model's own
            stretch = derive(*rope, n_ctx=n_ctx, n_ctx_train=int(raw.get("max_position_embeddings") or 0))
            self.model = StageModel(str(self.folder), 0, n_layer, threads=threads, dtype=dtype,
                                    rope=stretch if rope[0] or rope[1] else None)
        except (OSError, KeyError, ValueError) as e:
            raise ModelLoadError(f"transformers could not load {path}: {e}") from e
        self.n_batch = batch_tokens
        self._vocab_model: GgufVocab | None = None  # GGUF sources: eog ids and grammars from the vocab
        self.eog = self._eog()
        cfg = self.model.config
        n_ctx_train = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        self.info = ModelInfo(n_vocab=self.model.n_vocab, n_ctx=n_ctx, n_lanes=lanes, n_ctx_train=n_ctx_train,
                              description=f"{cfg.model_type} {self.model.n_params / 1e6:.0f}M "
                                          f"{dtype} (transformers {_version()})")

    def _eog(self) -> np.ndarray:
        if self.gguf:
            self._vocab_model = GgufVocab(self.source)
            return self._vocab_model.eog
        from ..codec.hf_tokenizer import eos_ids
        return np.array(sorted(eos_ids(self.folder)), dtype=np.int64)

    def grammar_tokenizer(self):
        if self._vocab_model is not None:
            return self._vocab_model.grammar_tokenizer()
        import llguidance.hf
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(self.folder))
        return llguidance.hf.from_tokenizer(tok, n_vocab=self.info.n_vocab)

    def open_lane(self, seq: int, keep: int) -> None:
        self.model.truncate(seq, keep)

    def close_lane(self, seq: int) -> None:
        pass  # the KV stays: a prefix-cache entry until the slot is opened again

    def copy_lane(self, src: int, dst: int, n: int) -> None:
        self.model.copy(src, dst, n)

    def forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        if sum(len(r.tokens) for r in runs) > self.n_batch:
            raise ValueError(f"plan has more than {self.n_batch} tokens")
        for r in runs:
            if r.pos + len(r.tokens) > self.info.n_ctx:
                raise ValueError(f"lane {r.seq}: {r.pos + len(r.tokens)} tokens exceed the lane's {self.info.n_ctx}")
        outs = self.model.run([(r.seq, r.pos, r.tokens) for r in runs], [r.sample for r in runs])
        return {r.seq: o for r, o in zip(runs, outs, strict=True) if r.sample and o is not None}

    def close(self) -> None:
        self.model.clear()
        if self._vocab_model is not None:
            self._vocab_model.close()
            self._vocab_model = None


def _version() -> str:
    import transformers

    return transformers.__version__
