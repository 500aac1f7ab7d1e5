"""`superfluid pull`, `superfluid models` and `superfluid rm`: models by their Hugging Face
name, in huggingface_hub's cache (runtime/hub.py); `serve NAME` pulls the same way."""

from __future__ import annotations

import argparse
import os
import sys


def add_parsers(sub) -> None:
    pu = sub.add_parser("pull", help="download a model by its Hugging Face name into the cache (REPO, REPO:QUANT or "
                                     "REPO:FILE.gguf; HF_TOKEN, HF_ENDPOINT and HF_HOME apply)")
    pu.add_argument("name", help="e.g. Qwen/Qwen3-4B-GGUF:Q4_K_M (no tag: Q4_K_M, then Q8_0, then the first GGUF)")
    offline_flag(pu)
    sub.add_parser("models", help="list the models pulled into the cache, with their sizes")
    rm = sub.add_parser("rm", help="delete a pulled model from the cache (REPO: all of it; REPO:QUANT: that file)")
    rm.add_argument("name")


def offline_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true",
                   help="use only models already in the cache, never the network (as HF_HUB_OFFLINE=1)")


def apply_offline(args: argparse.Namespace) -> None:
    """--offline as huggingface_hub reads it: set before it is imported, for every library
    of the process (transformers too)."""
    if getattr(args, "offline", False):
        os.environ["HF_HUB_OFFLINE"] = "1"


def run(args: argparse.Namespace) -> int:
    from ..errors import ModelLoadError
    from ..runtime import hub, hub_cache
    if args.command == "models":
        return _list(hub_cache.cached_models())
    name = hub.parse(args.name)
    if name is None:
        print(f"superfluid: {args.name} is not a Hugging Face name (OWNER/REPO[:QUANT|:FILE])", file=sys.stderr)
        return 2
    if args.command == "rm":
        removed = hub_cache.remove(name)
        if not removed:
            print(f"superfluid: {name} is not in the cache", file=sys.stderr)
            return 1
        print(f"removed {name} ({len(removed)} file{'s' * (len(removed) > 1)})")
        return 0
    try:
        pulled = hub.pull(name)
    except ModelLoadError as e:
        print(f"superfluid: {e.message}", file=sys.stderr)
        return 1
    print(f"{name}: {pulled.path} ({_size(pulled.bytes)})")
    return 0


def _list(rows) -> int:
    if not rows:
        print("no models pulled yet (superfluid pull OWNER/REPO[:QUANT])")
        return 0
    width = max(len(r.name) for r in rows)
    print(f"{'NAME':<{width}}  {'SIZE':>9}  FILES")
    for r in rows:
        print(f"{r.name:<{width}}  {_size(r.bytes):>9}  {r.files}")
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
