"""The engine's config from the command line's flags (serve and node): one clear line and an
exit status for a contradiction, before anything loads."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from ..config import EngineConfig, home
from ..engine import sampling_defaults


def engine_config(args: argparse.Namespace, src) -> EngineConfig | int:
    """The engine's config from its flags, or the exit status after one clear line."""
    from ..runtime.registry import default_runtime, is_hf_folder
    if args.runtime == "llamacpp" and is_hf_folder(src.path):
        print(f"superfluid: {src.path} is a Hugging Face folder: llama.cpp serves GGUF files; use --runtime "
              f"transformers (the default for a folder)", file=sys.stderr)
        return 2
    from ..runtime.rope import check as rope_problem
    problem = rope_problem(args.rope_scaling, args.rope_scale, args.yarn_orig_ctx)
    if problem:
        print(f"superfluid: {problem}", file=sys.stderr)
        return 2
    runtime = args.runtime or default_runtime(src.path)
    if args.kv_bits != 16 and args.flash_attn == "off":
        print(f"superfluid: --kv-bits {args.kv_bits} needs flash attention (llama.cpp quantizes V only with it): "
              f"drop --flash-attn off", file=sys.stderr)
        return 2
    if args.kv_bits != 16 and runtime != "llamacpp":
        print(f"superfluid: --kv-bits {args.kv_bits} quantizes llama.cpp's KV cache; the {runtime} runtime keeps "
              f"its own at 16 bits", file=sys.stderr)
        return 2
    if args.deterministic and (runtime != "llamacpp" or args.flash_attn == "on" or args.kv_bits != 16
                               or args.speculative != "off"):
        print("superfluid: --deterministic needs the llama.cpp runtime with flash attention off, 16-bit KV and no "
              "--speculative (their kernels compute a row differently by how many rows run with it)", file=sys.stderr)
        return 2
    step_tokens = max(args.step_tokens, args.max_batch)
    if args.kv_slots is not None and args.kv_slots < args.max_batch:
        print("superfluid: --kv-slots must be at least --max-batch", file=sys.stderr)
        return 2
    draft = draft_model(args, args.runtime or default_runtime(src.path))
    if isinstance(draft, int):
        return draft
    template = None
    if args.chat_template_file:
        try:
            with open(args.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        except OSError as e:
            print(f"superfluid: cannot read --chat-template-file {args.chat_template_file}: {e.strerror}",
                  file=sys.stderr)
            return 2
    return EngineConfig(model_path=src.path, model_id=src.id, max_batch=args.max_batch, max_queue=args.max_queue,
                        max_output=args.max_output,
                        max_context=args.max_context, threads=args.threads, step_tokens=step_tokens,
                        kv_slots=args.kv_slots, class_lanes=args.class_lanes,
                        aging_steps=args.aging_steps, step_target_s=args.step_ms / 1000, chat_template=template,
                        tool_dialect=args.tool_dialect,
                        runtime=args.runtime or default_runtime(src.path), pooling=args.pooling,
                        matryoshka=args.matryoshka, speculative=speculative(args.speculative),
                        spec_max_tokens=args.spec_max_tokens, draft_model=draft,
                        stream_interval_ms=args.stream_interval_ms, decode_steps=args.decode_steps,
                        rope_scaling=args.rope_scaling, rope_scale=args.rope_scale,
                        yarn_orig_ctx=args.yarn_orig_ctx,
                        sampling=sampling_defaults.from_args(args), kv_bits=args.kv_bits,
                        n_cpu_moe=getattr(args, "n_cpu_moe", 0), swa_cache=getattr(args, "swa_cache", "auto"),
                        gpu_layers=getattr(args, "gpu_layers", "auto"), devices=getattr(args, "device", ()),
                        split_mode=getattr(args, "split_mode", "layer"),
                        tensor_split=getattr(args, "tensor_split", ()),
                        flash_attn="on" if args.kv_bits != 16 else "off" if args.deterministic else (
                            args.flash_attn or "auto"),
                        **kv_disk(args), deterministic=args.deterministic)


def speculative(choice: str) -> str:
    """--speculative's drafter: auto is suffix where Arctic Inference's suffix tree is
    installed (scripts/suffix-tree.sh), else ngram."""
    if choice != "auto":
        return choice
    from ..runtime.suffix import suffix_tree_available
    return "suffix" if suffix_tree_available() else "ngram"


def draft_model(args: argparse.Namespace, runtime: str) -> str | int:
    """--draft-model's absolute path ("" without one), or the exit status after one clear line."""
    path = getattr(args, "draft_model", None)
    if args.speculative == "draft" and not path:
        print("superfluid: --speculative draft needs --draft-model GGUF (a small model of the same vocabulary)",
              file=sys.stderr)
        return 2
    if not path:
        return ""
    if args.speculative != "draft":
        print("superfluid: --draft-model is used with --speculative draft", file=sys.stderr)
        return 2
    if runtime != "llamacpp":
        print("superfluid: --draft-model drafts on llama.cpp: the served model must be a GGUF", file=sys.stderr)
        return 2
    if not os.path.isfile(path):
        print(f"superfluid: --draft-model {path}: no such file", file=sys.stderr)
        return 2
    return os.path.abspath(path)


def kv_disk(args: argparse.Namespace) -> dict:
    """The disk tier's directory and cap (none with --kv-disk off)."""
    if getattr(args, "kv_disk", "off") == "off":
        return {}
    d = home() / "kv"
    mb = args.kv_disk_mb
    if mb is None:
        probe = d
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        mb = min(16384.0, shutil.disk_usage(probe).free / 4 / (1 << 20))
    return {"kv_dir": str(d), "kv_disk_mb": float(mb)}
