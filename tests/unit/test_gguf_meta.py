"""runtime/gguf_meta.py reads a GGUF header's values, arrays included, and never raises on a
file that is not one (the memory fit then falls back to what llama.cpp's C API gives)."""

import struct

from superfluid.runtime.gguf_meta import read_values
from superfluid.runtime.memory_fit import shape_of


def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _gguf(tmp_path, kvs: list[bytes], name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    return str(p)


def test_scalars_arrays_and_skipped_string_arrays(tmp_path):
    path = _gguf(tmp_path, [
        _s("general.architecture") + struct.pack("<I", 8) + _s("lfm2"),
        _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + _s("a") + _s("bc") + _s("<|im_end|>"),
        _s("lfm2.block_count") + struct.pack("<II", 4, 6),
        _s("lfm2.attention.head_count_kv") + struct.pack("<IIQ", 9, 4, 6) + struct.pack("<6I", 0, 0, 2, 0, 0, 2),
    ])
    got = read_values(path, {"general.architecture", "lfm2.block_count", "lfm2.attention.head_count_kv", "x"})
    assert got == {"general.architecture": ["lfm2"], "lfm2.block_count": [6],
                   "lfm2.attention.head_count_kv": [0, 0, 2, 0, 0, 2]}
    assert read_values(path, {"tokenizer.ggml.tokens"}) == {"tokenizer.ggml.tokens": ["a", "bc", "<|im_end|>"]}


def test_not_a_gguf_or_cut_short_reads_as_nothing(tmp_path):
    whole = _gguf(tmp_path, [_s("lfm2.attention.head_count_kv") + struct.pack("<IIQ", 9, 4, 6) + b"\0" * 24])
    data = open(whole, "rb").read()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:-5])
    assert read_values(str(short), {"lfm2.attention.head_count_kv"}) == {}
    (tmp_path / "text.gguf").write_bytes(b"not a model at all")
    assert read_values(str(tmp_path / "text.gguf"), {"a"}) == {}
    assert read_values(str(tmp_path / "missing.gguf"), {"a"}) == {}
    huge = _gguf(tmp_path, [_s("a") + struct.pack("<IIQ", 9, 4, 1 << 60)], "huge.gguf")  # a count past the file
    assert read_values(huge, {"a"}) == {}


def test_the_shape_of_hybrid_and_sliding_window_layers():
    # LFM2: attention where head_count_kv is not 0, short convolutions elsewhere
    lfm2 = shape_of("lfm2", {"block_count": [6], "embedding_length": [256], "attention.head_count": [4],
                             "attention.head_count_kv": [0, 0, 2, 0, 0, 2], "shortconv.l_cache": [3]})
    assert (lfm2.full_token, lfm2.state) == (2 * 2 * 64 * 2 * 2, 4 * 256 * 2 * 4)
    # Gemma 3: of every 6 layers the last attends to every position, the rest to the window
    g = shape_of("gemma3", {"block_count": [12], "embedding_length": [640], "attention.head_count": [4],
                            "attention.head_count_kv": [1], "attention.key_length": [256],
                            "attention.value_length": [256], "attention.sliding_window": [512]})
    assert (g.full_token, g.swa_token, g.n_swa) == (2 * 1024, 10 * 1024, 512)
    # an architecture whose window pattern is not known is fitted as if every layer were full
    o = shape_of("llama4", {"block_count": [4], "embedding_length": [256], "attention.head_count": [4],
                            "attention.sliding_window": [8192]})
    assert o.n_swa == 0 and o.full_token == 4 * 4 * 128 * 2


def test_a_string_count_past_the_file_is_refused_at_once(tmp_path):
    strings = _s("t") + struct.pack("<IIQ", 9, 8, 1 << 60) + _s("") * 4
    path = _gguf(tmp_path, [strings, _s("a") + struct.pack("<II", 4, 1)])
    assert read_values(path, {"a"}) == {}
