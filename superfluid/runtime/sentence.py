"""The sentence runtime: embeddings from a sentence-transformers folder and pair scores from a
cross-encoder, with transformers on PyTorch (CPU, float32).

An embedding folder (modules.json: Transformer, Pooling, optional Normalize) runs through
`AutoModel`; its token states are pooled and normalised exactly as sentence-transformers does
(`pool`, then L2 normalisation when the Normalize module is there). A cross-encoder folder (a
`*ForSequenceClassification` head) runs through `AutoModelForSequenceClassification` and
answers each (query, document) pair with its raw logits. The daemon tokenizes (with the
model's special tokens); `embed` pads the step's items into batches of similar lengths and runs
them under `torch.inference_mode`. There are no generation lanes: this runtime only embeds."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoModelForSequenceClassification

from ..errors import EmbeddingUnsupported, ModelLoadError
from ..plan import EmbedItem, Run
from .base import ModelInfo, Runtime
from .sentence_config import POOLING_MODES, SentenceConfig, sentence_config

PADDED_TOKENS = 8192  # most padded tokens in one forward (32 inputs of a 256-token window)


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """sentence-transformers' Pooling over right-padded states: hidden (batch, seq, dim), mask
    (batch, seq) of 1 for tokens and 0 for padding. Each mode gives (batch, dim); several modes
    are concatenated in the order given. Padding never contributes."""
    out: list[torch.Tensor] = []
    m = mask.unsqueeze(-1).to(hidden.dtype)
    lengths = mask.sum(dim=1)
    for mode in modes:
        if mode == "cls":
            out.append(hidden[:, 0])
        elif mode == "max":
            out.append(hidden.masked_fill(m == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            total = (hidden * m).sum(dim=1)
            count = torch.clamp(m.sum(dim=1), min=1e-9)
            out.append(total / (count if mode == "mean" else torch.sqrt(count)))
        elif mode == "weightedmean":  # position i (from 1) weighs i
            w = m * torch.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype).view(1, -1, 1)
            out.append((hidden * w).sum(dim=1) / torch.clamp(w.sum(dim=1), min=1e-9))
        elif mode == "lasttoken":
            last = torch.clamp(lengths - 1, min=0).long()
            out.append(hidden[torch.arange(hidden.shape[0]), last] * (lengths > 0).unsqueeze(-1).to(hidden.dtype))
        else:
            raise ValueError(f"unknown pooling mode {mode!r} (known: {', '.join(sorted(POOLING_MODES))})")
    return torch.cat(out, dim=-1)


def batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of inputs grouped longest first, so that each group's padded size (count x its
    longest input) stays within `budget` (a lone input over it is a group of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class SentenceRuntime(Runtime):
    """Attributes beyond Runtime's: `kind` ("embedding" | "cross-encoder"), `pooling` (the
    mode, "+"-joined when several; "" for a cross-encoder), `dimensions` (the size of each
    returned vector: the pooled size, or the cross-encoder's num_labels), `config` (the
    folder's SentenceConfig). `info.n_ctx` and `info.embed_window` are the embedding window:
    the folder's max_seq_length, or the constructor's n_ctx when that is smaller."""

    def __init__(self, path: str, *, lanes: int = 0, n_ctx: int = 0, threads: int = 1, batch_tokens: int = 256):
        super().__init__()
        torch.set_num_threads(max(1, threads))
        self.source = path
        self.config: SentenceConfig = sentence_config(path)
        self.kind = self.config.kind
        self.pooling = self.config.pooling
        self.dimensions = self.config.dimensions
        self._modes = self.config.modes
        self.padded_tokens = max(batch_tokens, PADDED_TOKENS)
        folder = Path(path) / self.config.transformer_path
        try:
            auto = AutoModelForSequenceClassification if self.kind == "cross-encoder" else AutoModel
            self.model = auto.from_pretrained(str(folder), dtype=torch.float32).eval()
        except (OSError, ValueError, KeyError) as e:
            raise ModelLoadError(f"transformers could not load {path}: {e}") from e
        cfg = self.model.config
        self._pad = int(getattr(cfg, "pad_token_id", None) or 0)
        self._n_vocab = int(cfg.vocab_size)
        self._type_ids = ("token_type_ids" in inspect.signature(self.model.forward).parameters
                          and int(getattr(cfg, "type_vocab_size", 0) or 0) >= 2)
        if self.kind == "cross-encoder":
            self.dimensions = int(cfg.num_labels)
        window = min(self.config.max_seq_length, n_ctx) if n_ctx > 0 else self.config.max_seq_length
        n_params = sum(p.numel() for p in self.model.parameters())
        what = f"{self.pooling} embeddings" if self.kind == "embedding" else f"cross-encoder, {self.dimensions} labels"
        self.info = ModelInfo(n_vocab=self._n_vocab, n_ctx=window, n_lanes=0,
                              n_ctx_train=int(getattr(cfg, "max_position_embeddings", 0) or 0),
                              description=f"{cfg.model_type} {n_params / 1e6:.0f}M float32, {what} "
                                          f"(transformers {_version()})",
                              n_embd=self.dimensions, embed_window=window, pooling=self.pooling, kind=self.kind)
        self.eog = np.array([], dtype=np.int64)

    def embed(self, items: tuple[EmbedItem, ...]) -> list[np.ndarray]:
        """One float32 vector per item, in order: the pooled (and, when the folder says so,
        L2-normalised) embedding, or a cross-encoder's raw logits for a pair. Raises
        EmbeddingUnsupported for the whole batch when an item does not fit the model: a pair
        for an embedding model, a single text for a cross-encoder, an empty input, an input
        over the window or a token outside the vocabulary."""
        for it in items:
            self._check(it)
        out: list[np.ndarray | None] = [None] * len(items)
        with torch.inference_mode():
            for group in batches([len(it.tokens) for it in items], self.padded_tokens):
                vecs = self._forward([items[i] for i in group])
                for i, v in zip(group, vecs, strict=True):
                    out[i] = v
        assert all(v is not None for v in out)
        return [v for v in out if v is not None]

    def _check(self, it: EmbedItem) -> None:
        if self.kind == "cross-encoder" and not it.pair_at:
            raise EmbeddingUnsupported("this model is a cross-encoder: it scores (query, document) pairs "
                                       "and cannot embed a single text")
        if self.kind == "embedding" and it.pair_at:
            raise EmbeddingUnsupported("this model is not a cross-encoder: it cannot score pairs")
        if not it.tokens:
            raise EmbeddingUnsupported("an empty input cannot be embedded")
        if len(it.tokens) > self.info.embed_window:
            raise EmbeddingUnsupported(f"an input of {len(it.tokens)} tokens is over the "
                                       f"{self.info.embed_window}-token embedding window")
        if min(it.tokens) < 0 or max(it.tokens) >= self._n_vocab:
            raise EmbeddingUnsupported(f"a token id is outside the model's vocabulary of {self._n_vocab}")

    def _forward(self, group: list[EmbedItem]) -> list[np.ndarray]:
        """One padded forward over `group` (right padding, attention mask; token type 1 from
        each pair's pair_at on)."""
        width = max(len(it.tokens) for it in group)
        ids = torch.full((len(group), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        types = torch.zeros((len(group), width), dtype=torch.long)
        for b, it in enumerate(group):
            n = len(it.tokens)
            ids[b, :n] = torch.as_tensor(it.tokens, dtype=torch.long)
            mask[b, :n] = 1
            if it.pair_at:
                types[b, it.pair_at:n] = 1
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if self._type_ids:
            kwargs["token_type_ids"] = types
        out = self.model(**kwargs)
        if self.kind == "cross-encoder":
            vecs = out.logits
        else:
            vecs = pool(out[0], mask, self._modes)
            if self.config.normalize:
                vecs = torch.nn.functional.normalize(vecs, p=2, dim=-1)
        return list(vecs.float().numpy())

    # no generation: the scheduler gives this model no lanes (info.n_lanes == 0)
    def _no_lanes(self) -> EmbeddingUnsupported:
        return EmbeddingUnsupported(f"{self.source} is an {self.kind} model: it has no generation lanes")

    def open_lane(self, seq: int, keep: int) -> None:
        raise self._no_lanes()

    def close_lane(self, seq: int) -> None:
        raise self._no_lanes()

    def copy_lane(self, src: int, dst: int, n: int) -> None:
        raise self._no_lanes()

    def forward(self, runs: tuple[Run, ...]) -> dict[int, np.ndarray]:
        raise self._no_lanes()

    def close(self) -> None:
        """Drop the weights."""
        self.__dict__.pop("model", None)


def _version() -> str:
    import transformers

    return transformers.__version__
