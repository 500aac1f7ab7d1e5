"""runtime/hf_convert.gguf_weights: a process reads a GGUF's header once while the file is
unchanged (a stage node loads a layer range per head), and again once it changes."""

import os

from superfluid.runtime import hf_convert


def test_the_header_is_read_once_per_unchanged_file(tmp_path, monkeypatch):
    reads = []

    class Counting:
        def __init__(self, path):
            reads.append(path)

    monkeypatch.setattr(hf_convert, "GgufWeights", Counting)
    hf_convert._weights.cache_clear()
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF one")
    first = hf_convert.gguf_weights(f)
    assert hf_convert.gguf_weights(str(f)) is first and reads == [str(f)]
    f.write_bytes(b"GGUF, another file")  # a new size (and time): read again
    os.utime(f, ns=(0, os.stat(f).st_mtime_ns + 10**9))
    assert hf_convert.gguf_weights(f) is not first and reads == [str(f)] * 2
    hf_convert._weights.cache_clear()
