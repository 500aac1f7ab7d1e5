"""Model resolution and the per-lane context that fits in memory."""

import pytest

from superfluid.errors import ModelLoadError
from superfluid.runtime.memory_fit import fit_context
from superfluid.runtime.registry import ModelSource, default_runtime, resolve

GiB = 1 << 30


def fit(requested=None, n_ctx_train=8192, lanes=4, kv=1024, model=GiB, mem=64 * GiB) -> int:
    return fit_context(requested=requested, n_ctx_train=n_ctx_train, lanes=lanes,
                       kv_bytes_per_token=kv, model_bytes=model, mem_bytes=mem)


def test_requested_wins():
    assert fit(requested=1000) == 1000
    assert fit(requested=100_000, n_ctx_train=2048) == 100_000  # beyond training: the user's call


def test_requested_beyond_memory_is_refused_clearly():
    with pytest.raises(ModelLoadError, match="lower --max-context"):
        fit(requested=100_000, mem=1 << 20)


def test_plenty_of_memory_gives_the_trained_window():
    assert fit(n_ctx_train=8192) == 8192


def test_unknown_trained_window_defaults_to_4096():
    assert fit(n_ctx_train=0) == 4096


def test_memory_caps_the_context_and_rounds_down_to_256():
    # half of what is left after the weights, split over 4 lanes of 1 KiB per token
    mem = GiB + 2 * 4 * 1024 * 3000
    assert fit(mem=mem) == 2816  # 3000 // 256 * 256
    assert fit(mem=mem + 2 * 4 * 1024 * 72) == 3072


def test_trained_window_is_rounded_down_to_256():
    assert fit(n_ctx_train=1000) == 768


def test_never_below_256():
    assert fit(mem=0) == 256
    assert fit(mem=GiB // 2) == 256  # the weights alone do not fit


def test_more_lanes_mean_less_context_each():
    mem = GiB + 2 * 1024 * 16384
    assert fit(lanes=1, mem=mem) == 8192
    assert fit(lanes=4, mem=mem) == 4096
    assert fit(lanes=8, mem=mem) == 2048


def test_resolve_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        resolve(str(tmp_path / "nope.gguf"))


def test_resolve_non_gguf_file(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelLoadError, match="GGUF"):
        resolve(str(p))


def test_resolve_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(ModelLoadError):
        resolve(str(p))


def test_resolve_directory(tmp_path):
    with pytest.raises(ModelLoadError):
        resolve(str(tmp_path))


def test_resolve_gguf_file_gives_path_and_id(tmp_path):
    p = tmp_path / "tiny-model.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert resolve(str(p)) == ModelSource(str(p.resolve()), "tiny-model")


def test_resolve_a_folder_needs_a_hugging_face_model(tmp_path):
    with pytest.raises(ModelLoadError, match="not a Hugging Face model"):
        resolve(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        resolve(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    src = resolve(str(tmp_path))
    assert src.id == tmp_path.name and default_runtime(src.path) == "transformers"


def test_the_embedded_file_named_by_its_path_keeps_its_id(tmp_path):
    from superfluid.runtime.registry import embedded_model
    assert resolve(embedded_model().path).id == "SmolLM2-135M-Instruct"
    other = tmp_path / "other.gguf"
    other.symlink_to(embedded_model().path)
    assert resolve(str(other)).id == "other" and default_runtime(str(other)) == "llamacpp"
