"""Draft models for the speculation tests, cut from the embedded model: a same-vocabulary pair
is the embedded SmolLM2-135M (30 layers) and a copy of it that keeps only its first N layers
(the same embeddings, output norm and tied output; block_count = N; tensors `blk.{i}.*` for
i >= N dropped). `renamed=True` also renames one token (same length, in place): a vocabulary
the target must refuse.

The GGUF is rewritten by a small reader of its own, not the gguf package: GGUFReader parses
the 49k-token vocabulary element by element (5+ s here), this copies the metadata's bytes as
they are and patches the two values (well under a second)."""

from __future__ import annotations

import functools
import struct
from pathlib import Path

from ..scratch import scratch

HOME = Path(scratch("superfluid-draft-"))
RENAMED = (11, b"<jupyter_start>", b"<jupyter_START>")  # token id, its text, the other text
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # gguf value type -> bytes
STRING, ARRAY, UINT32 = 8, 9, 4


class _Cursor:
    def __init__(self, b: bytes, at: int = 0):
        self.b, self.at = b, at

    def take(self, fmt: str):
        v = struct.unpack_from("<" + fmt, self.b, self.at)
        self.at += struct.calcsize("<" + fmt)
        return v[0]

    def string(self) -> bytes:
        n = self.take("Q")
        self.at += n
        return self.b[self.at - n:self.at]

    def skip(self, vtype: int) -> None:
        if vtype == STRING:
            self.string()
        elif vtype == ARRAY:
            itype, n = self.take("I"), self.take("Q")
            if itype in SCALAR:
                self.at += SCALAR[itype] * n
            else:
                for _ in range(n):
                    self.skip(itype)
        else:
            self.at += SCALAR[vtype]


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@functools.cache
def draft_gguf(layers: int = 4, renamed: bool = False) -> str:
    from superfluid.runtime.registry import embedded_model

    src = Path(embedded_model().path).read_bytes()
    c = _Cursor(src, 4)
    version, n_tensors, n_kv = c.take("I"), c.take("Q"), c.take("Q")
    head = bytearray(src[:4] + struct.pack("<I", version))
    kv = bytearray()
    alignment = 32
    for _ in range(n_kv):
        start = c.at
        key = c.string()
        vtype = c.take("I")
        value_at = c.at
        if key.endswith(b".block_count") and vtype == UINT32:
            c.at += 4
            kv += src[start:value_at] + struct.pack("<I", layers)
            continue
        if key == b"general.alignment":
            alignment = struct.unpack_from("<I", src, value_at)[0]
        if key == b"tokenizer.ggml.tokens" and renamed:
            c.take("I"), c.take("Q")
            for _ in range(RENAMED[0]):
                c.string()
            at = c.at
            assert c.string() == RENAMED[1]
            c.at = value_at
            c.skip(vtype)
            entry = bytearray(src[start:c.at])
            text_at = at + 8 - start
            entry[text_at:text_at + len(RENAMED[2])] = RENAMED[2]
            kv += entry
            continue
        c.skip(vtype)
        kv += src[start:c.at]
    infos = []  # (name, bytes of its info up to the offset, offset)
    for _ in range(n_tensors):
        start = c.at
        name = c.string().decode()
        n_dims = c.take("I")
        c.at += 8 * n_dims + 4
        infos.append((name, src[start:c.at], c.take("Q")))
    data_at = _align(c.at, alignment)
    ends = sorted(off for _, _, off in infos)[1:] + [len(src) - data_at]
    size = {off: end - off for off, end in zip(sorted(off for _, _, off in infos), ends, strict=True)}
    kept = [t for t in infos if not (t[0].startswith("blk.") and int(t[0].split(".")[1]) >= layers)]
    table, data = bytearray(), bytearray()
    for _, info, off in kept:
        data += b"\0" * (_align(len(data), alignment) - len(data))
        table += info + struct.pack("<Q", len(data))
        data += src[data_at + off:data_at + off + size[off]]
    head += struct.pack("<QQ", len(kept), n_kv) + kv + table
    head += b"\0" * (_align(len(head), alignment) - len(head))
    out = HOME / f"SmolLM2-{layers}-layers{'-renamed' if renamed else ''}.gguf"
    out.write_bytes(bytes(head) + bytes(data))
    return str(out)
