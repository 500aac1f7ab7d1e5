"""llama-server's common command-line flags, accepted by `superfluid serve` as aliases of its
own, so `llama-server -m M.gguf -c 4096 -np 4` becomes `superfluid serve -m M.gguf -c 4096
-np 4` (docs/migrating.md has the whole mapping). Model names: `--alias` and
`--strict-models`."""

from __future__ import annotations

import argparse


def _count(s: str) -> int:
    """llama-server's counts: a positive number, or 0 / -1 for its default ("auto")."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{s}'") from None
    if v < -1:
        raise argparse.ArgumentTypeError("must be at least -1 (-1 and 0: the default)")
    return v


def _freq_scale(s: str) -> float:
    """--rope-freq-scale: the frequency scale itself, 1 / --rope-scale."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{s}'") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError("must be in (0, 1]: 0.25 stretches the positions 4 times")
    return v


def _aliases(s: str) -> list[tuple[str, str | None]]:
    """NAME=ID (NAME stands for the model ID) or NAME (for the default model, as llama-server's
    -a); comma-separated."""
    out: list[tuple[str, str | None]] = []
    for part in filter(None, (p.strip() for p in s.split(","))):
        name, sep, target = part.partition("=")
        name, target = name.strip(), target.strip()
        if not name or (sep and not target):
            raise argparse.ArgumentTypeError(f"expected NAME or NAME=MODEL_ID, got '{part}'")
        out.append((name, target or None))
    if not out:
        raise argparse.ArgumentTypeError("expected NAME or NAME=MODEL_ID")
    return out


CACHE_TYPES = {"f16": 16, "q8_0": 8, "q4_0": 4}  # llama-server's -ctk/-ctv as --kv-bits


def add_flags(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("llama-server compatibility (docs/migrating.md)")
    g.add_argument("-m", dest="llama_model", metavar="PATH", help="the model to serve (the positional MODEL)")
    for short, long in (("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v")):
        g.add_argument(short, long, dest=f"llama_{long[2:].replace('-', '_')}", choices=tuple(CACHE_TYPES),
                       help="--kv-bits: f16 (16), q8_0 (8) or q4_0 (4); K and V together")
    g.add_argument("-hf", "-hfr", "--hf-repo", dest="llama_hf", metavar="REPO[:QUANT]",
                   help="the model to serve by its Hugging Face name (the positional MODEL)")
    g.add_argument("-c", "--ctx-size", dest="llama_ctx", type=_count, metavar="N",
                   help="--max-context: tokens per lane (0: the model's window)")
    g.add_argument("-np", "--parallel", dest="llama_parallel", type=_count, metavar="N",
                   help="--max-batch: lanes decoded together (-1: the default)")
    g.add_argument("-n", "--n-predict", "--predict", dest="llama_predict", type=_count, metavar="N",
                   help="--max-output: the most tokens one generation produces (-1: no cap)")
    g.add_argument("-t", dest="llama_threads", type=_count, metavar="N", help="--threads (-1: the default)")
    g.add_argument("--rope-freq-scale", dest="llama_freq_scale", type=_freq_scale, metavar="F",
                   help="--rope-scale 1/F: the positions' frequency scale (0.25 stretches them 4 times)")
    g.add_argument("--jinja", action="store_true", help="accepted: the model's own jinja chat template is always used")
    g.add_argument("-a", "--alias", dest="aliases", type=_aliases, action="append", default=[], metavar="NAME[=ID]",
                   help="NAME stands for the model ID (default: the default model); repeatable or comma-separated")
    g.add_argument("--strict-models", action="store_true",
                   help="a model name this server does not serve is a 404 even when it serves one model "
                        "(default: that model answers, as llama-server does)")

def apply_flags(args: argparse.Namespace) -> str | None:
    """Fold the aliases into the flags they stand for; an error line for a contradiction."""
    for given, flag in ((args.llama_model, "-m"), (args.llama_hf, "-hf")):
        if given:
            if args.model and args.model != given:
                return f"give the model once: as MODEL, -m or -hf ({flag})"
            args.model = given
    types = {t for t in (args.llama_cache_type_k, args.llama_cache_type_v) if t}
    if len(types) > 1 or (types and (args.llama_cache_type_k is None or args.llama_cache_type_v is None)):
        return "-ctk and -ctv: superfluid quantizes K and V together; give both the same type (or --kv-bits)"
    if types:
        bits = CACHE_TYPES[types.pop()]
        if args.kv_bits not in (16, bits):
            return f"-ctk/-ctv and --kv-bits {args.kv_bits} disagree: give one"
        args.kv_bits = bits
    if args.llama_ctx and args.llama_ctx > 0:
        args.max_context = args.llama_ctx
    if args.llama_parallel and args.llama_parallel > 0:
        args.max_batch = args.llama_parallel
    if args.llama_predict and args.llama_predict > 0:
        args.max_output = args.llama_predict
    if args.llama_threads and args.llama_threads > 0:
        args.threads = args.llama_threads
    if args.llama_freq_scale:
        if args.rope_scale and abs(args.rope_scale * args.llama_freq_scale - 1) > 1e-6:
            return "--rope-scale N and --rope-freq-scale 1/N say the same: give one"
        args.rope_scale = 1 / args.llama_freq_scale
    args.aliases = [a for group in args.aliases for a in group]
    return None
