"""The sampling defaults a request falls back to. For each parameter a request leaves out,
the first of: the operator's flag (`superfluid serve --temperature 0.6 ...`), the model's
recommended sampling (GGUF `general.sampling.*`, as llama.cpp reads it), then the API's own
documented default (OpenAI's temperature 1.0, llama-server's 0.8, ...). A request's own
value always wins. Engines hold the merged operator + model table (`sampling_defaults`);
each API lays it over its own table."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..limits import MAX_REPEAT_LAST_N

# name, type, lowest, highest, flags (llama-server's spelling second)
FLAGS: tuple[tuple[str, type, float, float, tuple[str, ...]], ...] = (
    ("temperature", float, 0.0, 2.0, ("--temperature", "--temp")),
    ("top_p", float, 1e-9, 1.0, ("--top-p",)),
    ("top_k", int, 0, 1 << 20, ("--top-k",)),
    ("min_p", float, 0.0, 1.0, ("--min-p",)),
    ("typical_p", float, 1e-9, 1.0, ("--typical-p", "--typical")),
    ("repeat_penalty", float, 1e-9, 100.0, ("--repeat-penalty",)),
    ("repeat_last_n", int, -1, MAX_REPEAT_LAST_N, ("--repeat-last-n",)),
    ("presence_penalty", float, -2.0, 2.0, ("--presence-penalty",)),
    ("frequency_penalty", float, -2.0, 2.0, ("--frequency-penalty",)),
)
# llama.cpp's keys for a model's recommended sampling (gguf-py Keys.General.SAMPLING_*)
GGUF_KEYS = {"temperature": "general.sampling.temp", "top_k": "general.sampling.top_k",
             "top_p": "general.sampling.top_p", "min_p": "general.sampling.min_p",
             "repeat_last_n": "general.sampling.penalty_last_n",
             "repeat_penalty": "general.sampling.penalty_repeat"}
_RANGES = {name: (kind, lo, hi) for name, kind, lo, hi, _ in FLAGS}


def _value(name: str, raw: object) -> float | int | None:
    """`raw` as parameter `name`'s type when it is in range, else None."""
    kind, lo, hi = _RANGES[name]
    try:
        v = kind(float(raw)) if kind is int else float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if kind is int and float(raw) != v:  # type: ignore[arg-type]
        return None
    return v if lo <= v <= hi else None


def add_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling defaults (a request's own value wins; docs/api.md#sampling-parameters)")
    for name, _kind, lo, hi, flags in FLAGS:
        def parse(s: str, name: str = name, lo: float = lo, hi: float = hi) -> float | int:
            v = _value(name, s)
            if v is None:
                raise argparse.ArgumentTypeError(f"expected a number in [{lo:g}, {hi:g}], got '{s}'")
            return v
        g.add_argument(*flags, dest=f"sampling_{name}", type=parse, metavar="X",
                       help=f"default {name} (over the model's recommendation and the API's default)")


def from_args(args: argparse.Namespace) -> tuple[tuple[str, float], ...]:
    """The flags the operator gave, as EngineConfig.sampling."""
    return tuple((name, v) for name, *_ in FLAGS if (v := getattr(args, f"sampling_{name}", None)) is not None)


def from_gguf(meta: Callable[[str], str | None]) -> dict[str, float]:
    """The model's recommended sampling from its GGUF metadata (values out of range are left out)."""
    out: dict[str, float] = {}
    for name, key in GGUF_KEYS.items():
        raw = meta(key)
        if raw is not None and (v := _value(name, raw)) is not None:
            out[name] = v
    return out


def merged(model: dict[str, float], flags: tuple[tuple[str, float], ...]) -> dict[str, float]:
    """The engine's defaults: the operator's flags over the model's recommendation."""
    return {**model, **dict(flags)}


def for_api(table: dict[str, Any], engine: dict[str, float]) -> dict[str, Any]:
    """An API's defaults: the engine's (operator and model) over the API's documented ones."""
    return {**table, **engine}
