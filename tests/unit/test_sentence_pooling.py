"""The sentence runtime's pure parts: sentence-transformers' pooling modes on a tiny tensor,
length-sorted padded batches, and reading a folder's embedding setup from its JSON files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from superfluid.errors import ModelLoadError
from superfluid.runtime.sentence_config import is_sentence_folder, pooling_modes, sentence_config

torch = pytest.importorskip("torch")

from superfluid.runtime.sentence import batches, pool  # noqa: E402

# two inputs, three positions, two dims; the padding holds large values that must never count
H = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [100.0, 100.0]],
                  [[5.0, -6.0], [-100.0, 100.0], [100.0, -100.0]]])
M = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(("mode", "want"), [
    ("cls", [[1.0, 2.0], [5.0, -6.0]]),
    ("mean", [[2.0, -1.0], [5.0, -6.0]]),
    ("max", [[3.0, 2.0], [5.0, -6.0]]),
    ("mean_sqrt_len_tokens", [[4.0 / 2**0.5, -2.0 / 2**0.5], [5.0, -6.0]]),
    ("weightedmean", [[(1 * 1 + 2 * 3) / 3, (1 * 2 + 2 * -4) / 3], [5.0, -6.0]]),
    ("lasttoken", [[3.0, -4.0], [5.0, -6.0]]),
])
def test_each_pooling_mode_ignores_padding(mode, want):
    assert torch.allclose(pool(H, M, (mode,)), torch.tensor(want))


def test_several_modes_are_concatenated_in_order():
    got = pool(H, M, ("cls", "mean"))
    assert got.shape == (2, 4)
    assert torch.allclose(got, torch.cat([pool(H, M, ("cls",)), pool(H, M, ("mean",))], dim=-1))


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown pooling mode"):
        pool(H, M, ("median",))


def test_batches_sort_longest_first_within_the_padded_budget():
    lengths = [3, 10, 4, 9, 1]
    groups = batches(lengths, 20)
    assert sorted(i for g in groups for i in g) == list(range(5))
    assert groups[0] == [1, 3]  # 2 x 10 = 20 padded tokens
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 20
    assert batches([50], 8) == [[0]]  # a lone input over the budget still runs


def test_pooling_config_reading():
    assert pooling_modes({"pooling_mode_mean_tokens": True}) == ("mean",)
    assert pooling_modes({"pooling_mode_max_tokens": True, "pooling_mode_cls_token": True}) == ("cls", "max")
    assert pooling_modes({}) == ("mean",)  # sentence-transformers' default
    assert pooling_modes({"pooling_mode": "lasttoken"}) == ("lasttoken",)
    assert pooling_modes({"pooling_mode": ["cls", "mean"]}) == ("cls", "mean")
    with pytest.raises(ModelLoadError):
        pooling_modes({"pooling_mode": "median"})


def _folder(root: Path, modules: list[str] | None, config: dict, pooling: dict | None = None,
            sbert: dict | None = None) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    if modules is not None:
        paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
        (root / "modules.json").write_text(json.dumps(
            [{"idx": i, "name": str(i), "path": paths[m], "type": f"sentence_transformers.models.{m}"}
             for i, m in enumerate(modules)]))
        (root / "1_Pooling").mkdir()
        (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling or {}))
    if sbert is not None:
        (root / "sentence_bert_config.json").write_text(json.dumps(sbert))
    return root


BERT = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 8, "max_position_embeddings": 512}


def test_sentence_config_of_an_embedding_folder(tmp_path):
    d = _folder(tmp_path / "e", ["Transformer", "Pooling", "Normalize"], BERT,
                {"word_embedding_dimension": 8, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True},
                {"max_seq_length": 128, "do_lower_case": True})
    c = sentence_config(d)
    assert (c.kind, c.pooling, c.modes, c.normalize, c.max_seq_length, c.dimensions, c.lowercase) == \
        ("embedding", "cls+mean", ("cls", "mean"), True, 128, 16, True)
    assert is_sentence_folder(d)


def test_sentence_config_window_without_sentence_bert_config(tmp_path):
    d = _folder(tmp_path / "e", ["Transformer", "Pooling"], BERT, {"pooling_mode": "cls"})
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 384}))
    c = sentence_config(d)
    assert (c.max_seq_length, c.normalize, c.dimensions) == (384, False, 8)
    roberta = _folder(tmp_path / "r", ["Transformer", "Pooling"],
                      {**BERT, "model_type": "xlm-roberta", "max_position_embeddings": 514})
    assert sentence_config(roberta).max_seq_length == 512


def test_sentence_config_of_a_cross_encoder(tmp_path):
    d = _folder(tmp_path / "x", None, {**BERT, "architectures": ["BertForSequenceClassification"],
                                       "id2label": {"0": "LABEL_0"}})
    c = sentence_config(d)
    assert (c.kind, c.pooling, c.dimensions, c.activation, c.max_seq_length) == ("cross-encoder", "", 1, "sigmoid", 512)
    assert is_sentence_folder(d)


def test_unsupported_folders_are_refused(tmp_path):
    dense = _folder(tmp_path / "d", ["Transformer", "Pooling", "Dense"], BERT)
    with pytest.raises(ModelLoadError, match="Dense"):
        sentence_config(dense)
    plain = _folder(tmp_path / "p", None, {**BERT, "architectures": ["LlamaForCausalLM"]})
    assert not is_sentence_folder(plain)
    with pytest.raises(ModelLoadError, match="no modules.json"):
        sentence_config(plain)
