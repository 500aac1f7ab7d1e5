"""What a sentence-transformers folder or a cross-encoder folder declares, read from its JSON
files only (no torch), so the daemon knows an embedding model's kind, window and size before
its worker starts.

An embedding folder has `modules.json` (a Transformer module, then Pooling, optionally
Normalize); a cross-encoder folder has a config.json whose architecture ends in
`ForSequenceClassification`. The reading follows sentence-transformers: pooling from
`1_Pooling/config.json` (the current `pooling_mode` key or the legacy `pooling_mode_*` flags,
mean when none is set), the window from `sentence_bert_config.json`'s max_seq_length, else the
tokenizer's model_max_length capped by the model's positions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError

# sentence-transformers' legacy flags, in the order it concatenates the modes
LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                  "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                  "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
POOLING_MODES = frozenset(LEGACY_POOLING.values())
_KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class SentenceConfig:
    """kind: "embedding" or "cross-encoder". pooling: the pooling mode, or several joined by
    "+" (their vectors are concatenated, as sentence-transformers does); "" for a
    cross-encoder. dimensions: the output size (the pooled size, or a cross-encoder's
    num_labels). max_seq_length: most tokens in one input, special tokens included.
    lowercase: the folder asks for text to be lowercased before tokenizing. activation: what
    sentence-transformers' CrossEncoder applies to the raw logits by default ("sigmoid" or
    "identity"; "" for an embedding model); the runtime returns raw logits either way."""
    kind: str
    pooling: str
    normalize: bool
    max_seq_length: int
    dimensions: int
    transformer_path: str = ""  # the Transformer module's folder, relative to the model folder
    lowercase: bool = False
    activation: str = ""

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self.pooling.split("+")) if self.pooling else ()


def _json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None


def _dict(path: Path) -> dict:
    d = _json(path)
    if not isinstance(d, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return d


def is_cross_encoder(config: dict) -> bool:
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])


def is_sentence_folder(folder: str | Path) -> bool:
    """A folder this module (and the sentence runtime) serves: sentence-transformers modules,
    or a sequence-classification head (a cross-encoder)."""
    d = Path(folder)
    if not d.is_dir():
        return False
    if (d / "modules.json").is_file():
        return True
    try:
        return is_cross_encoder(_dict(d / "config.json"))
    except ModelLoadError:
        return False


def pooling_modes(pool_cfg: dict) -> tuple[str, ...]:
    """The pooling modes of a 1_Pooling/config.json, in sentence-transformers' order."""
    mode = pool_cfg.get("pooling_mode")
    if mode:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(m for key, m in LEGACY_POOLING.items() if pool_cfg.get(key)) or ("mean",)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad:
        raise ModelLoadError(f"unknown pooling mode {bad[0]!r} (known: {', '.join(sorted(POOLING_MODES))})")
    return modes


def _window(cfg: dict, tok_cfg: dict, declared: object) -> int:
    if isinstance(declared, int) and declared > 0:
        return declared
    positions = int(cfg.get("max_position_embeddings") or 0)
    if "roberta" in str(cfg.get("model_type", "")) or str(cfg.get("model_type", "")) == "camembert":
        positions -= 2  # RoBERTa's positions start after the padding id
    tok_max = tok_cfg.get("model_max_length")
    candidates = [n for n in (positions, tok_max) if isinstance(n, int) and 0 < n < 1 << 30]
    return min(candidates) if candidates else 512


def sentence_config(folder: str | Path) -> SentenceConfig:
    """Read a folder's embedding setup. Raises ModelLoadError for a folder that is neither a
    sentence-transformers model nor a cross-encoder, or that has modules this runtime does
    not implement (anything but Transformer, Pooling and Normalize)."""
    d = Path(folder)
    cfg = _dict(d / "config.json")
    modules = _json(d / "modules.json")
    if not modules:
        if not is_cross_encoder(cfg):
            raise ModelLoadError(f"{folder} has no modules.json and no sequence-classification head: "
                                 f"not an embedding model or cross-encoder")
        n_labels = int(cfg.get("num_labels") or len(cfg.get("id2label") or {}) or 1)
        st = cfg.get("sentence_transformers") or {}
        act = str(st.get("activation_fn") or ("sigmoid" if n_labels == 1 else "identity"))
        act = act.rsplit(".", 1)[-1].lower()
        return SentenceConfig("cross-encoder", "", False, _window(cfg, _dict(d / "tokenizer_config.json"), None),
                              n_labels, lowercase=False, activation=act)
    if not isinstance(modules, list):
        raise ModelLoadError(f"{d / 'modules.json'} is not a list of modules")
    kinds: list[tuple[str, str]] = []
    for m in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        name = next((k for k in _KNOWN_MODULES if str(m.get("type", "")).endswith(k)), None)
        if name is None:
            raise ModelLoadError(f"{folder}: the sentence-transformers module {m.get('type')!r} is not supported "
                                 f"(this runtime runs Transformer, Pooling and Normalize)")
        kinds.append((name, str(m.get("path") or "")))
    if [k for k, _ in kinds[:2]] != ["Transformer", "Pooling"] or any(k != "Normalize" for k, _ in kinds[2:]):
        raise ModelLoadError(f"{folder}: modules.json must be Transformer, Pooling[, Normalize]; it is "
                             f"{', '.join(k for k, _ in kinds)}")
    tpath = kinds[0][1]
    tdir = d / tpath
    tcfg = _dict(tdir / "config.json") or cfg
    sbert = _dict(tdir / "sentence_bert_config.json")
    pool_cfg = _dict(d / kinds[1][1] / "config.json")
    modes = pooling_modes(pool_cfg)
    width = int(pool_cfg.get("embedding_dimension") or pool_cfg.get("word_embedding_dimension")
                or tcfg.get("hidden_size") or 0)
    return SentenceConfig("embedding", "+".join(modes), len(kinds) > 2,
                          _window(tcfg, _dict(tdir / "tokenizer_config.json"), sbert.get("max_seq_length")),
                          width * len(modes), transformer_path=tpath, lowercase=bool(sbert.get("do_lower_case")))
