"""Tiny random-weight GGUF models of each model family, for the family test matrix: a
transformers config of the family (hidden 256, 4-6 layers, SmolLM2's 49152-token vocabulary),
its weight matrices drawn from N(0, 0.1) with a fixed seed, converted to Q8_0 (quantized, as
the models users pull are: llama.cpp's quantized matmuls give a row the same bits whatever
the batch, f16's do not) by the converter of the installed llama-cpp-python's own llama.cpp
(from its sdist, downloaded once).
`family_gguf(name)` gives the GGUF's path; FAMILIES says what each is and what llama.cpp reports
for it (recurrent, hybrid, sliding window). `family_gguf(name, size="1b")` gives a bigger one for
benchmarks (bench/families.py): every width (hidden, intermediate, experts', heads; head sizes
kept) times w, the layer pattern repeated to about `size` parameters, converted to f16 and
quantized to Q4_K_M (as CPU users run a model of that size); cached beside the tiny ones.

Models are cached under ~/.cache/superfluid/families/, keyed by a hash of the family's config,
the llama-cpp-python version and FIXTURE_VERSION: the first test session makes each in about
5 s (the first of all ~25 s: the sdist and the tokenizer), later ones take none. Making holds a
file lock and writes through a temp file and a rename, so pytest workers racing for one model
make it once. The same recipe gives the same bytes.

Every family carries SmolLM2's tokenizer (bos 1 `<|im_start|>`, eos 2 `<|im_end|>`) and its
ChatML template, except gpt-oss, which needs Harmony: there SmolLM2's special tokens 1-8 are
renamed to Harmony's markers (bos 1 `<|startoftext|>`, eos 2 `<|return|>`; llama.cpp then
takes `<|return|>` and `<|call|>` as end of generation, as for gpt-oss) and the template is
llama.cpp's copy of gpt-oss's (models/templates/openai-gpt-oss-120b.jinja in the sdist)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FIXTURE_VERSION = 3  # bump when the recipe changes (weights, tokenizer, this code)
HOME = Path.home() / ".cache" / "superfluid" / "families"
HARMONY_TEMPLATE = "models/templates/openai-gpt-oss-120b.jinja"  # in the sdist's llama.cpp
HARMONY_TOKENS = ["<|startoftext|>", "<|return|>", "<|start|>", "<|message|>", "<|end|>", "<|channel|>",
                  "<|call|>", "<|constrain|>"]  # in place of SmolLM2's special tokens 1..8
BOS, EOS = 1, 2
STD = 0.1  # of the weight matrices: at 0.05 greedy decoding repeats a token or two (llama, qwen3moe)
COMMON = dict(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=8192, tie_word_embeddings=True,
              bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS)


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # dense | moe | swa | hybrid | recurrent: how its memory (KV cache, recurrent state) is laid out
    config: str  # the transformers config class
    params: dict  # its arguments, over COMMON (the whole of them where `own`)
    arch: str  # general.architecture in the GGUF
    moe: bool = False  # experts
    recurrent: bool = False  # what llama.cpp reports: llama_model_is_recurrent,
    hybrid: bool = False  # llama_model_is_hybrid,
    n_swa: int = 0  # llama_model_n_swa
    template: str = "chatml"  # chatml (SmolLM2's) | harmony (gpt-oss's, with Harmony's special tokens)
    flags: tuple[str, ...] = ()  # the converter's
    own: bool = False  # params are the whole config, not over COMMON
    hub_layer_types: tuple[tuple[str, str], ...] = ()  # config.json's layer_types renamed as on the hub
    blocked: str = ""  # why it cannot be made here ("" when it can)

    def config_dict(self) -> dict:
        return {"config": self.config, **({} if self.own else COMMON), **self.params}


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llama", "dense", "LlamaConfig", {}, "llama"),
    Family("qwen3moe", "moe", "Qwen3MoeConfig", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256),
           "qwen3moe", moe=True),
    Family("gemma3", "swa", "Gemma3TextConfig",
           dict(sliding_window=128, query_pre_attn_scalar=64,
                layer_types=["sliding_attention"] * 3 + ["full_attention"],
                tie_word_embeddings=False),  # tied (and x sqrt(hidden) on the way in), greedy repeats one token
           "gemma3", n_swa=128),
    Family("lfm2", "hybrid", "Lfm2Config",
           dict(num_hidden_layers=6, layer_types=["conv", "conv", "full_attention"] * 2), "lfm2", hybrid=True),
    Family("qwen35", "hybrid", "Qwen3_5TextConfig",
           dict(layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64),
           "qwen35", hybrid=True, flags=("--no-mtp",)),
    Family("mamba2", "recurrent", "Mamba2Config",
           dict(vocab_size=49152, hidden_size=256, num_hidden_layers=4, expand=2, num_heads=8, head_dim=64,
                state_size=64, n_groups=1, tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS,
                pad_token_id=EOS),
           "mamba2", recurrent=True, own=True),
    Family("granitemoehybrid", "hybrid", "GraniteMoeHybridConfig",  # as granite-4.0-h-tiny: Mamba2 + attention, MoE
           dict(layer_types=["mamba", "mamba", "attention", "mamba"], num_local_experts=8, num_experts_per_tok=2,
                intermediate_size=256, shared_intermediate_size=512, mamba_n_heads=8, mamba_d_head=64,
                mamba_expand=2, mamba_d_state=64, mamba_n_groups=1),
           "granitehybrid", moe=True, hybrid=True,
           # transformers 5 writes full_attention/linear_attention, the converter looks for "attention": with
           # none found every layer is a Mamba one, and llama.cpp cannot load the file
           hub_layer_types=(("full_attention", "attention"), ("linear_attention", "mamba"))),
    Family("gptoss", "swa", "GptOssConfig",
           dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=256, sliding_window=128,
                layer_types=["sliding_attention", "full_attention"] * 2,
                max_position_embeddings=131072,  # its YaRN's (factor 32 over 4096)
                tie_word_embeddings=False),  # llama.cpp's gpt-oss needs an output.weight
           "gpt-oss", moe=True, n_swa=128, template="harmony"),
]}


def _version() -> str:
    return importlib.metadata.version("llama_cpp_python")


def _key(f: Family) -> str:
    blob = json.dumps([f.config_dict(), f.template, f.flags, _version(), FIXTURE_VERSION], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _run(cmd: list[str], what: str, **kw) -> None:
    run = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if run.returncode:
        raise RuntimeError(f"{what} failed ({run.returncode}):\n{(run.stdout + run.stderr)[-4000:]}")


@contextlib.contextmanager
def _locked():
    HOME.mkdir(parents=True, exist_ok=True)
    with open(HOME / ".lock", "w") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield


def _converter() -> Path:
    """llama.cpp's converter (and gguf-py, and the Harmony template) from the installed
    llama-cpp-python's own sdist, downloaded once (76 MB) and then only these kept."""
    v = _version()
    out = HOME / f"llama.cpp-{v}"
    if (out / "convert_hf_to_gguf.py").is_file():
        return out
    keep = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", HARMONY_TEMPLATE)
    with tempfile.TemporaryDirectory(dir=HOME) as tmp:
        # --no-binary of this package only: pip still prepares the sdist's metadata, and with
        # :all: it would build its build dependencies (cmake) from source too
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
              f"llama-cpp-python=={v}", "-d", tmp], f"downloading llama-cpp-python {v}'s sdist")
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                rel = m.name.partition("/vendor/llama.cpp/")[2]
                if rel.startswith(keep) and (m.isfile() or m.isdir()):
                    m.name = rel
                    tar.extract(m, Path(tmp) / "llama.cpp", filter="data")
        os.replace(Path(tmp) / "llama.cpp", out)
    return out


def _tokenizer() -> Path:
    """SmolLM2's tokenizer, read from the embedded GGUF once (seconds), saved as a HF folder."""
    out = HOME / f"tokenizer-smollm2-{FIXTURE_VERSION}"
    if out.is_dir():
        return out
    from transformers import AutoTokenizer

    from superfluid.runtime.registry import embedded_model

    p = Path(embedded_model().path)
    tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    assert (tok.bos_token_id, tok.eos_token_id) == (BOS, EOS), (tok.bos_token_id, tok.eos_token_id)
    tmp = tempfile.mkdtemp(dir=HOME)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)
    return out


def _harmony(hf: Path, converter: Path) -> None:
    """Make the saved SmolLM2 tokenizer speak Harmony: its special tokens 1..8 renamed to
    Harmony's markers (ids kept, so the vocabulary and its merges stay as they are), gpt-oss's
    template."""
    tj = json.loads((hf / "tokenizer.json").read_text())
    names = dict(enumerate(HARMONY_TOKENS, start=1))
    vocab = tj["model"]["vocab"]
    for a in tj["added_tokens"]:
        if a["id"] in names:
            del vocab[a["content"]]
            a["content"] = names[a["id"]]
            vocab[a["content"]] = a["id"]
    (hf / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    tc = json.loads((hf / "tokenizer_config.json").read_text())
    tc.update(bos_token=names[BOS], eos_token=names[EOS], pad_token=names[EOS])
    (hf / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    shutil.copy(converter / HARMONY_TEMPLATE, hf / "chat_template.jinja")


def _model(f: Family, hf: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, f.config)(**{k: v for k, v in f.config_dict().items() if k != "config"})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:  # matrices, embeddings, experts, convolutions; norms, biases, SSM A/D/dt as initialized
                p.normal_(0, STD, generator=gen)
    model.save_pretrained(hf)
    if f.hub_layer_types:  # transformers 5 writes its own names, which the converter does not know
        cj = json.loads((hf / "config.json").read_text())
        cj["layer_types"] = [dict(f.hub_layer_types).get(t, t) for t in cj["layer_types"]]
        (hf / "config.json").write_text(json.dumps(cj, indent=2))


def _make(f: Family, out: Path) -> None:
    converter, tokenizer = _converter(), _tokenizer()
    with tempfile.TemporaryDirectory(dir=HOME) as tmp:
        hf = Path(tmp) / "hf"
        shutil.copytree(tokenizer, hf)
        if f.template == "harmony":
            _harmony(hf, converter)
        _model(f, hf)
        part, shim = Path(tmp) / "model.gguf", Path(tmp) / "shim"
        shim.mkdir()  # the llama converter imports sentencepiece before it looks for a tokenizer.model
        (shim / "sentencepiece.py").write_text("class SentencePieceProcessor: ...  # never used: no tokenizer.model\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(converter / "gguf-py"), str(shim)])}
        _run([sys.executable, str(converter / "convert_hf_to_gguf.py"), str(hf), "--outfile", str(part),
              "--outtype", "q8_0", *f.flags], f"converting {f.name}", env=env)
        os.replace(part, out)


WIDE = ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_intermediate_size", "num_attention_heads",
        "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads", "num_heads", "mamba_n_heads")


def _params(f: Family) -> int:
    import torch
    import transformers

    cfg = getattr(transformers, f.config)(**{k: v for k, v in f.config_dict().items() if k != "config"})
    with torch.device("meta"):
        return sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())


def _sized(f: Family, size: str) -> Family:
    """`f` at about `size` parameters ("300m", "1b"): widths x w (w ~ sqrt(size / 15M): 4 at 300m,
    8 at 1b; 64-wide heads, so 256-multiple rows for Q4_K), then its layers repeated d times to
    reach the size (counted on the meta device); converted to f16 (its flags' --outtype comes
    last), quantized to Q4_K_M by _make_sized."""
    import dataclasses

    target = float(size[:-1]) * {"m": 1e6, "b": 1e9}[size[-1].lower()]
    w = max(1, min(8, round((target / 15e6) ** 0.5)))
    base = f.config_dict()
    wide = {k: v * w for k, v in base.items() if k in WIDE}

    def at(d: int) -> Family:
        deep = {"num_hidden_layers": base["num_hidden_layers"] * d}
        if "layer_types" in base:
            deep["layer_types"] = list(base["layer_types"]) * d
        return dataclasses.replace(f, params={**f.params, **wide, **deep}, flags=(*f.flags, "--outtype", "f16"))

    one, two = _params(at(1)), _params(at(2))
    return at(max(1, round(1 + (target - one) / (two - one))))


def _make_sized(f: Family, out: Path) -> None:
    import llama_cpp

    f16 = out.with_suffix(".f16.part")
    try:
        _make(f, f16)
        q = llama_cpp.llama_model_quantize_default_params()
        q.ftype, q.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, os.cpu_count() or 1
        part = out.with_suffix(".part")
        if llama_cpp.llama_model_quantize(str(f16).encode(), str(part).encode(), q):
            raise RuntimeError(f"quantizing {f.name} to Q4_K_M failed")
        os.replace(part, out)
    finally:
        f16.unlink(missing_ok=True)


MADE: dict[str, float] = {}  # seconds each family took to make in this process


@functools.cache
def family_gguf(name: str, size: str = "") -> str:
    """The path of family `name`'s tiny GGUF (or with `size`, e.g. "1b", its Q4_K_M one of about
    that many parameters), made on first use (seconds; minutes at 1b) and cached on disk."""
    f = FAMILIES[name]
    if f.blocked:
        raise RuntimeError(f"family {name!r} cannot be made here: {f.blocked}")
    if size:
        f = _sized(f, size)
    out = HOME / (f"{name}-{size}-q4_k_m-{_key(f)}.gguf" if size else f"{name}-{_key(f)}.gguf")
    if not out.is_file():
        with _locked():
            if not out.is_file():
                t = time.monotonic()
                (_make_sized if size else _make)(f, out)
                MADE[name] = time.monotonic() - t
    return str(out)

