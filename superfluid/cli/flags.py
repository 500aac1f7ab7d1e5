"""The command line's argument types and the flags of a model's engine (shared by
`superfluid serve` and `superfluid node serve`)."""

from __future__ import annotations

import argparse

from ..config import DEFAULT_HOST, default_threads
from ..request import Qos



def _gpu_layers(value: str) -> str:
    from ..runtime.offload import parse_layers
    try:
        return parse_layers(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _names(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names or len(names) > 64 or any(len(n) > 128 for n in names):
        raise argparse.ArgumentTypeError("expected device names, comma-separated (CUDA0,CUDA1)")
    return names


def _split(value: str) -> tuple[float, ...]:
    try:
        parts = tuple(float(p) for p in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers, comma-separated (3,1), got {value!r}") from None
    if not parts or len(parts) > 64 or any(not 0 <= p < 1e6 for p in parts) or sum(parts) <= 0:
        raise argparse.ArgumentTypeError("expected shares of 0 or more, comma-separated, not all 0")
    return parts

def _positive(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return v


def _interval(s: str) -> int:
    v = int(s)
    if not 0 <= v <= 1000:
        raise argparse.ArgumentTypeError("must be 0 to 1000 (milliseconds)")
    return v


def _scale(s: str) -> float:
    """--rope-scale: a positive number of times the trained window."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{s}'") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number")
    return v


def _window(s: str) -> int:
    """--yarn-orig-ctx: a token count; 0 is llama-server's "the model's"."""
    if not s.isdigit():
        raise argparse.ArgumentTypeError(f"expected a token count, got '{s}'")
    return int(s)


def _hostport(s: str) -> tuple[str, int]:
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError("expected HOST:PORT with a port up to 65535")
    return host.strip("[]") or DEFAULT_HOST, int(port)


def _hostports(s: str) -> tuple[tuple[str, int], ...]:
    return tuple(_hostport(x.strip()) for x in s.split(",") if x.strip())


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _rpc_nodes(s: str) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    """--rpc-nodes: HOST:PORT entries are dialed; `auto` takes every RPC node that joins
    (`node join --rpc`), a NAME the node that joins under that --name."""
    dialed: list[tuple[str, int]] = []
    names: list[str] = []
    for x in (x.strip() for x in s.split(",")):
        if not x:
            continue
        if ":" in x:
            dialed.append(_hostport(x))
        elif set(x) <= NAME_CHARS and len(x) <= 64:
            names.append(x)
        else:
            raise argparse.ArgumentTypeError(f"{x!r}: expected HOST:PORT, a node's name, or auto")
    if not dialed and not names:
        raise argparse.ArgumentTypeError("expected HOST:PORT, a node's name, or auto")
    return tuple(dialed), tuple(dict.fromkeys(names))


def _proportions(s: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("use comma-separated numbers, e.g. 1,2,2") from None
    if not out or any(x < 0 for x in out) or sum(out) <= 0:
        raise argparse.ArgumentTypeError("use non-negative numbers, not all zero")
    return out


def _qos(s: str) -> Qos:
    s = s.strip().lower()
    try:
        return Qos(int(s)) if s.isdigit() else Qos[s.upper()]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError("use interactive, completion, agent, background or embedding (0-4)") from None


def _class_lanes(s: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in filter(None, s.split(",")):
        name, sep, n = part.partition("=")
        if not sep or not n.isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(f"expected CLASS=N, got '{part}'")
        out.append((int(_qos(name)), int(n)))
    return tuple(out)


def _tool_dialect(s: str) -> str:
    from ..codec.dialects import names
    if s not in names():
        raise argparse.ArgumentTypeError(f"unknown dialect '{s}': use one of {', '.join(names())}")
    return s


def _engine_flags(s: argparse.ArgumentParser) -> None:
    """The flags of a model's engine (serve and node serve)."""
    s.add_argument("--max-batch", type=_positive, default=8, help="lanes: sequences decoded together (default 8)")
    s.add_argument("--max-queue", type=_positive, default=512, help="generations a model keeps waiting for a lane; more get 503 queue_full with Retry-After (default 512)")
    s.add_argument("--max-output", type=_positive, metavar="N", help="the most tokens one generation produces, whatever a request asks (default: the room its prompt leaves in the window; llama-server's -n)")
    s.add_argument("--max-context", type=_positive, help="tokens per lane (default: the model's trained window, capped to fit memory)")
    s.add_argument("--threads", type=_positive, default=default_threads(), help="the most llama.cpp threads a step uses (default: every core; fewer while other processes keep cores busy)")
    s.add_argument("--runtime", choices=("llamacpp", "transformers"), help="the inference runtime: llama.cpp on a GGUF, or transformers (PyTorch; needs superfluid[hf]) on a Hugging Face folder or a GGUF converted once to one under the home (default: llamacpp for a GGUF, transformers for a folder)")
    s.add_argument("--step-tokens", type=_positive, default=512, help="token budget of one step: decodes plus prefill chunks (default 512, llama.cpp's micro-batch)")
    s.add_argument("--kv-bits", type=int, choices=(16, 8, 4), default=16, help="the KV cache's cells: 16 (f16, default), 8 (q8_0: about half the memory, so about twice the window or lanes) or 4 (q4_0); 8 and 4 turn on flash attention, which llama.cpp needs for them (llama.cpp runtime only)")
    s.add_argument("--n-cpu-moe", "-ncmoe", type=int, default=0, metavar="N", help="keep the mixture-of-experts weights of the first N layers in host memory, the rest of the model on the GPU (llama-server's flag: a MoE model whose weights do not fit the device); --cpu-moe: every layer's")
    s.add_argument("--gpu-layers", "-ngl", "--n-gpu-layers", type=_gpu_layers, default="auto", metavar="N|auto|all", help="layers on the GPU (llama-server's -ngl): auto (default) fits the weights and every lane's KV into the devices' free memory, shrinking an unset window to 4096 first, then leaving the last layers that do not fit on the CPU; all; or a number (0: none). The startup line says what was chosen (docs/gpu.md). No effect on a CPU build")
    s.add_argument("--device", "-dev", type=_names, default=(), metavar="DEV[,DEV...]", help="the devices layers go to, by ggml's names (CUDA0, Vulkan0, ...; none: the CPU only); default: every GPU the build sees (the first line of `serve` lists them)")
    s.add_argument("--split-mode", "-sm", choices=("none", "layer", "row"), default="layer", help="with several GPUs: layer (default) gives each device whole layers, row splits each layer's rows (CUDA), none uses the first device only")
    s.add_argument("--tensor-split", "-ts", type=_split, default=(), metavar="N[,N...]", help="with several GPUs: their shares of the layers, in --device order (3,1: three quarters on the first); default: by free memory")
    s.add_argument("--swa-cache", choices=("auto", "full", "window"), default="auto", help="a sliding-window model's cache (Gemma 3, gpt-oss): full keeps every position of its window layers (a cached prefix is cut anywhere), window only their window (far less memory; the prefix cache is then state checkpoints and --speculative is refused); auto (default): full where the window asked for (or the trained one) fits memory, else window. The startup line says which (docs/models.md)")
    s.add_argument("--swa-full", action="store_const", const="full", dest="swa_cache", help="llama-server's flag: --swa-cache full")
    s.add_argument("--cpu-moe", "-cmoe", action="store_const", const=-1, dest="n_cpu_moe", help="keep every layer's mixture-of-experts weights in host memory (--n-cpu-moe for all layers)")
    s.add_argument("--flash-attn", "-fa", choices=("off", "on", "auto"), default=None, help="llama.cpp's flash attention: auto (default, as llama-server), on or off (on a CPU: about 0.75x the prefill speed, but from a few thousand tokens of context a faster decode and cheaper --speculative verification, docs/performance.md); --kv-bits 8 and 4 turn it on")
    s.add_argument("--deterministic", action="store_true", help="the same greedy tokens (and seeded draws) whether a prompt was cached, restored from disk, cut in other chunks or run beside other lanes: flash attention off and no one-row prefill run (about 0.75x the prefill speed on a CPU); llama.cpp only, no speculation (docs/sessions.md)")
    s.add_argument("--speculative", choices=("off", "ngram", "suffix", "draft", "auto"), default="off", help="speculative decoding: ngram drafts from the lane's own context (prompt lookup), suffix from suffix trees over the lane's context and earlier outputs (Arctic Inference), draft from a small model of the same vocabulary (--draft-model), auto: suffix where Arctic Inference's suffix tree is installed, else ngram; drafts are verified losslessly in the step's batch (default off: on this project's 2-core bench it is not yet faster everywhere, docs/performance.md)")
    s.add_argument("--draft-model", metavar="GGUF", help="with --speculative draft: a small GGUF of the served model's vocabulary that proposes the drafts (llama.cpp; loaded in the same worker)")
    s.add_argument("--spec-max-tokens", type=_positive, default=8, help="most drafted tokens a lane verifies in one step (default 8)")
    s.add_argument("--stream-interval-ms", type=_interval, default=50, metavar="MS", help="a stream's tokens are committed to the session log and sent at most every MS milliseconds, as one event; its first token and its end go at once: less work per token, so a faster decode where the daemon shares the decode's cores; 0: every token as it comes (default 50; docs/performance.md)")
    s.add_argument("--decode-steps", type=_positive, default=4, metavar="N", help="while every lane only decodes and nothing waits, one scheduler plan runs up to N decode steps (as many as take about 50 ms), so the daemon's per-plan work is paid once for them; a request that arrives waits for the plans in flight; 1: a plan a step (default 4; docs/performance.md)")
    s.add_argument("--chat-template-file", metavar="FILE", help="a jinja chat template to use instead of the model's own (tool and reasoning markers are read from it)")
    s.add_argument("--tool-dialect", type=_tool_dialect, metavar="NAME", help="how the model writes tool calls: hermes, qwen3_coder, llama3, mistral, deepseek, deepseek_v3_1, harmony, granite, gemma, functionary or generic (default: detected from the chat template; docs/tools.md)")
    s.add_argument("--kv-slots", type=_positive, help="KV sequences in the worker (default 2 x --max-batch); slots beyond the lanes keep finished and preempted prefixes warm")
    s.add_argument("--class-lanes", type=_class_lanes, default=(), metavar="CLASS=N,...", help="most lanes a class may hold, e.g. background=2,agent=6")
    s.add_argument("--aging-steps", type=_positive, default=256, help="a waiting job rises one class every N steps (default 256)")
    s.add_argument("--step-ms", type=_positive, default=250, help="prefill chunks are sized so a step takes about this long (default 250)")
    s.add_argument("--pooling", choices=("mean", "cls", "last"), help="embeddings from a GGUF: how token states become one vector (default: what the GGUF declares, else mean)")
    s.add_argument("--matryoshka", action="store_true", help="the model was trained for shortened embeddings: requests may ask for fewer dimensions")
    s.add_argument("--kv-disk", choices=("on", "off"), default="on", help="keep finished and evicted prefixes' KV on disk under $SUPERFLUID_HOME/kv, restored instead of prefilled, across restarts too (default on; llama.cpp models)")
    s.add_argument("--rope-scaling", choices=("none", "linear", "yarn"), default="", help="serve a window past the model's trained one by stretching its rotary positions: yarn (degrades least), linear, or none (never stretch); with --max-context past the trained window and no --rope-scale, the stretch is --max-context over the trained window (default: the model's own rope settings; docs/context.md)")
    s.add_argument("--rope-scale", type=_scale, default=0.0, metavar="N", help="stretch the positions N times (llama-server's --rope-scale: rope_freq_scale = 1/N); without --max-context the window is N x the trained one (default: derived from --max-context with --rope-scaling, else the model's own)")
    s.add_argument("--yarn-orig-ctx", type=_window, default=0, metavar="N", help="with --rope-scaling yarn: the window the model was trained on, that yarn stretches (default: the model's trained window)")
    s.add_argument("--kv-disk-mb", type=_positive, metavar="MB", help="most MiB of KV on disk, least recently used evicted first (default: a quarter of the free disk, at most 16 GiB)")
