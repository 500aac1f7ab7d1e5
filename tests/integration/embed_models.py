"""A tiny cross-encoder for the embedding tests (random weights, MiniLM's tokenizer), built
with transformers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def build_cross_encoder(folder: Path, minilm: str) -> str:
    """A BertForSequenceClassification with one label, small and seeded, saved as a Hugging
    Face folder with MiniLM's tokenizer.json."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=1)
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    shutil.copy(os.path.join(minilm, "tokenizer.json"), folder / "tokenizer.json")
    return str(folder)
