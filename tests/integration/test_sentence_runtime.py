"""The sentence runtime in-process, on real models: all-MiniLM-L6-v2 from its PyPI package
gives sentence-transformers' own vectors (tests/fixtures/minilm_reference.json, made by
make_minilm_reference.py) when tokenized as the daemon tokenizes; a vector does not depend on
the batch it is padded into; a cross-encoder (a tiny random-weight BERT with a
sequence-classification head) scores a pair as transformers' own forward does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from superfluid.codec.hf_tokenizer import HfTokenizer
from superfluid.errors import EmbeddingUnsupported
from superfluid.plan import EmbedItem, StepPlan
from superfluid.runtime.registry import EMBEDDING_ID, default_runtime, embedded_embedding_model, resolve
from superfluid.runtime.sentence_config import sentence_config

from .embed_models import build_cross_encoder

torch = pytest.importorskip("torch")  # superfluid[hf]
from superfluid.runtime.sentence import SentenceRuntime  # noqa: E402  (it needs torch)

REFERENCE = json.loads((Path(__file__).parents[1] / "fixtures" / "minilm_reference.json").read_text())


def cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def minilm() -> str:
    return embedded_embedding_model().path


@pytest.fixture(scope="module")
def runtime(minilm):
    rt = SentenceRuntime(minilm, lanes=0, n_ctx=0, threads=2, batch_tokens=256)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def tok(minilm):
    return HfTokenizer(minilm)


def test_the_package_folder_is_served_in_place(minilm):
    src = embedded_embedding_model()
    assert src.id == EMBEDDING_ID and (Path(minilm) / "model.safetensors").is_file()
    assert "site-packages" in minilm  # nothing copied or unzipped under the home


def test_the_folder_is_served_by_the_sentence_runtime(minilm):
    assert resolve(minilm).path == minilm
    assert default_runtime(minilm) == "sentence"
    c = sentence_config(minilm)
    assert (c.kind, c.pooling, c.normalize, c.max_seq_length, c.dimensions) == ("embedding", "mean", True, 256, 384)


def test_the_tokenizer_adds_cls_and_sep_and_never_truncates(tok):
    ids = tok.encode("Hello world", add_special=True)
    assert ids[0] == tok._tok.token_to_id("[CLS]") and ids[-1] == tok._tok.token_to_id("[SEP]")
    assert tok.encode("Hello world") == ids[1:-1]
    assert tok.chat_template is None and tok.eog == frozenset()  # an embedding model: no chat
    long = " ".join(["word"] * 300)  # the folder's tokenizer.json pads and cuts at 128
    assert len(tok.encode(long, add_special=True)) == 302


def test_embeddings_equal_sentence_transformers(runtime, tok):
    assert (runtime.kind, runtime.pooling, runtime.dimensions) == ("embedding", "mean", 384)
    assert (runtime.info.embed_window, runtime.info.n_embd, runtime.info.kind) == (256, 384, "embedding")
    ids = [tok.encode(t, add_special=True) for t in REFERENCE["texts"]]
    assert [len(x) for x in ids] == REFERENCE["tokens"]  # the reference's own tokenization
    vectors = runtime.embed(tuple(EmbedItem(k, tuple(x)) for k, x in enumerate(ids)))
    assert len(vectors) == len(REFERENCE["vectors"])
    for text, got, want in zip(REFERENCE["texts"], vectors, REFERENCE["vectors"], strict=True):
        assert got.dtype == np.float32 and got.shape == (384,)
        assert cos(got, want) >= 0.9999, text
        assert abs(float(np.linalg.norm(got)) - 1.0) < 1e-5  # the Normalize module


def test_a_vector_does_not_depend_on_its_batch(runtime, tok):
    short = tuple(tok.encode("a short query about cats", add_special=True))
    alone = runtime.embed((EmbedItem(0, short),))[0]
    longer = [tuple(tok.encode(t, add_special=True)) for t in REFERENCE["texts"]]
    items = (EmbedItem(1, longer[4]), EmbedItem(2, short), EmbedItem(3, longer[2]), EmbedItem(4, short))
    out = runtime.embed(items)
    assert cos(out[1], alone) >= 0.99999 and cos(out[3], alone) >= 0.99999
    assert cos(out[0], REFERENCE["vectors"][4]) >= 0.9999  # order kept though batches sort by length
    small = SentenceRuntime.__new__(SentenceRuntime)  # tiny batches: many padded forwards, same vectors
    small.__dict__.update(runtime.__dict__, padded_tokens=16)
    for a, b in zip(small.embed(items), out, strict=True):
        assert cos(a, b) >= 0.99999


def test_inputs_the_model_cannot_embed_are_refused(runtime, tok):
    with pytest.raises(EmbeddingUnsupported, match="not a cross-encoder"):
        runtime.embed((EmbedItem(0, (101, 7592, 102, 2088, 102), pair_at=3),))
    with pytest.raises(EmbeddingUnsupported, match="window"):
        runtime.embed((EmbedItem(0, tuple([101] + [7592] * 300 + [102])),))
    with pytest.raises(EmbeddingUnsupported, match="empty"):
        runtime.embed((EmbedItem(0, ()),))
    with pytest.raises(EmbeddingUnsupported, match="lanes"):
        runtime.open_lane(0, 0)


def test_step_answers_embeds_with_vectors(runtime, tok):
    ids = tuple(tok.encode(REFERENCE["texts"][1], add_special=True))
    result = runtime.step(StepPlan(7, embeds=(EmbedItem(41, ids), EmbedItem(42, (101, 2054, 102), pair_at=2))))
    assert [v.key for v in result.vectors] == [41, 42]
    ok, bad = result.vectors  # a bad item fails alone: the batch is tried again item by item
    assert bad.code == EmbeddingUnsupported.code and not bad.data and not ok.error
    assert cos(np.frombuffer(ok.data, dtype="<f4"), REFERENCE["vectors"][1]) >= 0.9999


def test_encode_pair_matches_transformers_tokenizer(tok, minilm):
    from transformers import AutoTokenizer

    a, b = "what is a cat?", "Cats are small domesticated felines."
    ids, at = tok.encode_pair(a, b)
    ref = AutoTokenizer.from_pretrained(minilm)(a, b)
    assert ids == ref["input_ids"]
    assert at == ref["token_type_ids"].index(1) == len(tok.encode(a, add_special=True))
    assert ids[at:-1] == tok.encode(b)
    # special tokens in user text stay text (transformers would parse this [SEP])
    ids, at = tok.encode_pair(a, "one [SEP] two")
    assert ids[at:-1] == tok.encode("one [SEP] two") and ids.count(ids[-1]) == 2
    # a rerank's query is tokenized once for all its documents: the same pairs as tokenizing
    # each pair whole (what transformers does for the first one above)
    docs = [b, "one [SEP] two", "", "x " * 300]
    tok._tok.encode_special_tokens = True
    whole = [tok._tok.encode(a, d, add_special_tokens=True) for d in docs]
    assert tok.encode_pairs(a, docs) == [(list(w.ids), w.type_ids.index(1)) for w in whole]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, minilm) -> str:
    return build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"), minilm)


def test_a_cross_encoder_scores_pairs_as_transformers_does(cross_encoder, tok):
    from transformers import BertForSequenceClassification

    assert default_runtime(cross_encoder) == "sentence" and resolve(cross_encoder).path == cross_encoder
    rt = SentenceRuntime(cross_encoder, lanes=0, n_ctx=0, threads=2)
    assert (rt.kind, rt.dimensions, rt.pooling, rt.info.embed_window) == ("cross-encoder", 1, "", 128)
    assert sentence_config(cross_encoder).activation == "sigmoid"
    model = BertForSequenceClassification.from_pretrained(cross_encoder).eval()
    query = "what do cats eat?"
    docs = ["Cats are carnivores and eat meat.", "The stock market fell today after a long and quiet week.", "fish"]
    pairs = [tok.encode_pair(query, d) for d in docs]
    scores = rt.embed(tuple(EmbedItem(k, tuple(ids), pair_at=at) for k, (ids, at) in enumerate(pairs)))
    for (ids, at), got in zip(pairs, scores, strict=True):
        types = [0] * at + [1] * (len(ids) - at)
        with torch.no_grad():
            want = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0].numpy()
        assert got.shape == (1,) and got.dtype == np.float32
        assert np.allclose(got, want, atol=1e-5), (got, want)
    with pytest.raises(EmbeddingUnsupported, match="cross-encoder"):
        rt.embed((EmbedItem(0, tuple(tok.encode(query, add_special=True))),))
    rt.close()
