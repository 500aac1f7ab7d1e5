"""A GGUF file's metadata values by key, arrays included: llama.cpp's C API gives a key's value
as text but skips arrays (`llama_model_meta_val_str`), and a hybrid model says which layers
have attention only in one (`lfm2.attention.head_count_kv`: 0 for a convolution layer).
gguf-py's reader parses every tensor and array (2.6 s for a small model); this reads the
header's key-value section only, stops at the last key asked for, and skips the arrays it
does not want (the vocabulary) by their lengths."""

from __future__ import annotations

import mmap
import struct

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
MAX_KEYS = 1 << 20  # a header with more is not a model file
MAX_HEADER = 256 << 20  # nor one whose values run longer (a 256k vocabulary and its merges: ~15 MB)


def read_values(path: str, keys: set[str]) -> dict[str, list]:
    """{key: its value as a list (a scalar: one item)} for the keys the file has; {} for a
    file that is not GGUF v2/v3 or is cut short (the caller falls back to what it knows)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _read(m, set(keys))
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return {}


def _read(m, keys: set[str]) -> dict[str, list]:
    if m[:4] != b"GGUF" or struct.unpack_from("<I", m, 4)[0] not in (2, 3):
        return {}
    (n_kv,) = struct.unpack_from("<Q", m, 16)
    at = 24
    out: dict[str, list] = {}
    for _ in range(min(n_kv, MAX_KEYS)):
        if not keys - out.keys():
            break
        key, at = _string(m, at)
        (kind,) = struct.unpack_from("<I", m, at)
        at += 4
        want = key in keys
        if kind == ARRAY:
            (item, count) = struct.unpack_from("<IQ", m, at)
            at += 12
            values, at = _array(m, at, item, count, want)
        else:
            values, at = _array(m, at, kind, 1, want)
        if want:
            out[key] = values
    return out


def _string(m, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", m, at)
    if at + 8 + n > len(m):
        raise ValueError("cut short")
    return bytes(m[at + 8:at + 8 + n]).decode(), at + 8 + n


def _array(m, at: int, kind: int, count: int, want: bool) -> tuple[list, int]:
    if kind == STRING:
        if count > (min(len(m), MAX_HEADER) - at) // 8:
            raise ValueError("more strings than the header has room for")
        values = []
        for _ in range(count):
            s, at = _string(m, at) if want else (None, at + 8 + struct.unpack_from("<Q", m, at)[0])
            values.append(s)
        return (values if want else []), at
    if kind not in SCALARS:
        raise ValueError(f"value type {kind}")
    fmt = f"<{count}{SCALARS[kind]}"
    end = at + struct.calcsize(fmt)
    if end > min(len(m), MAX_HEADER):
        raise ValueError("cut short")
    return (list(struct.unpack_from(fmt, m, at)) if want else []), end
