"""The family fixture (tests/integration/families.py) without making a model: its declarations
instantiate as transformers configs, its cache key, the cached file used as is, a blocked family's
error, and two workers racing for one model making it once."""

import threading
import time

import pytest

from tests.integration import families as fam

KINDS = {"dense", "moe", "swa", "hybrid", "recurrent"}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setattr(fam, "HOME", tmp_path)
    return tmp_path


def test_families_are_declared_consistently():
    transformers = pytest.importorskip("transformers")
    for name, f in fam.FAMILIES.items():
        assert f.name == name and f.kind in KINDS and f.template in ("chatml", "harmony")
        assert f.recurrent == (f.kind == "recurrent") and f.hybrid == (f.kind == "hybrid"), name
        cfg = getattr(transformers, f.config)(**{k: v for k, v in f.config_dict().items() if k != "config"})
        assert (cfg.vocab_size, cfg.hidden_size, cfg.bos_token_id, cfg.eos_token_id) == (49152, 256, 1, 2), name
        if f.n_swa:
            assert cfg.sliding_window == f.n_swa and {"sliding_attention", "full_attention"} <= set(cfg.layer_types)
        if f.hybrid:
            assert len(set(cfg.layer_types)) == 2, (name, cfg.layer_types)  # both kinds of layer


def test_key_is_the_config_the_version_and_the_fixture_version(monkeypatch):
    keys = {fam._key(f) for f in fam.FAMILIES.values()}
    assert len(keys) == len(fam.FAMILIES)
    llama = fam.FAMILIES["llama"]
    before = fam._key(llama)
    monkeypatch.setattr(fam, "_version", lambda: "0.0.0")
    assert fam._key(llama) != before
    monkeypatch.undo()
    monkeypatch.setattr(fam, "FIXTURE_VERSION", fam.FIXTURE_VERSION + 1)
    assert fam._key(llama) != before


def test_a_cached_model_is_used_as_is(home, monkeypatch):
    f = fam.FAMILIES["llama"]
    (home / f"llama-{fam._key(f)}.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(fam, "_make", lambda *a: pytest.fail("made again"))
    assert fam.family_gguf.__wrapped__("llama") == str(home / f"llama-{fam._key(f)}.gguf")


def test_a_blocked_family_says_why(home, monkeypatch):
    blocked = fam.Family("nope", "dense", "LlamaConfig", {}, "llama", blocked="its converter is missing")
    monkeypatch.setitem(fam.FAMILIES, "nope", blocked)
    with pytest.raises(RuntimeError, match="its converter is missing"):
        fam.family_gguf.__wrapped__("nope")


def test_racing_workers_make_a_model_once(home, monkeypatch):
    made = []

    def make(f, out):
        made.append(f.name)
        time.sleep(0.2)
        out.write_bytes(b"GGUF")

    monkeypatch.setattr(fam, "_make", make)
    paths = []
    workers = [threading.Thread(target=lambda: paths.append(fam.family_gguf.__wrapped__("lfm2"))) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert made == ["lfm2"] and len(set(paths)) == 1 and len(paths) == 3
