"""RoPE scaling: a context window past the one the model was trained on, as llama-server
offers it (`--rope-scaling none|linear|yarn`, `--rope-scale N`, `--yarn-orig-ctx N`).

Pure: the daemon derives the scaling once to size the window and say what it serves, and
each runtime derives the same from the same settings to apply it (llama.cpp's context
parameters, transformers' rope config). Nothing here imports a runtime.

One difference from llama-server, on purpose: there `--rope-scaling yarn -c 32768` without
`--rope-scale` keeps the model's frequency scale (1 for most models), so the positions past
the trained window stay untrained; here the scale is derived from the window asked for
(32768 over a trained 8192: x4), which is what the flag is for."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("none", "linear", "yarn")  # "" (no flag): the model's own rope settings
STRETCH = ("linear", "yarn")  # the kinds that stretch positions over a larger window


@dataclass(frozen=True)
class Rope:
    kind: str  # "", none, linear or yarn
    factor: float  # the window's stretch over `base` (1/rope_freq_scale); 0: the model's own
    base: int  # the window the model's positions were trained on (YaRN's original context)
    orig_ctx: int = 0  # --yarn-orig-ctx as given (0: the model's; llama.cpp's default)

    @property
    def freq_scale(self) -> float:
        """llama.cpp's rope_freq_scale; 0 leaves the model's own."""
        return 1.0 / self.factor if self.factor else 0.0

    @property
    def scales(self) -> bool:
        return self.kind != "none" and self.factor > 1.0


def check(kind: str, scale: float, orig_ctx: int) -> str | None:
    """A contradiction among the flags, as one line for the user; None when they agree."""
    if kind and kind not in KINDS:
        return f"--rope-scaling must be one of {', '.join(KINDS)}"
    if scale < 0 or orig_ctx < 0:
        return "--rope-scale and --yarn-orig-ctx must be positive"
    if kind == "none" and scale:
        return "--rope-scale stretches nothing with --rope-scaling none: drop one"
    if orig_ctx and kind in ("none", "linear"):
        return "--yarn-orig-ctx is used with --rope-scaling yarn"
    return None


def trained_window(n_ctx_train: int, scale: float, orig_ctx: int = 0) -> int:
    """The window to serve when none is asked for: the trained one, stretched by an explicit
    --rope-scale (a derived scale needs a window to derive it from, so it stretches nothing)."""
    base = orig_ctx or n_ctx_train
    return int(base * scale) if scale > 1.0 and base else n_ctx_train


def derive(kind: str, scale: float, orig_ctx: int, *, n_ctx: int, n_ctx_train: int) -> Rope:
    """What a lane of n_ctx tokens runs with. An explicit `scale` is kept; without one, a
    stretching kind stretches the trained window (or --yarn-orig-ctx) to n_ctx when n_ctx is
    past it, and leaves the model's own scale when it is not."""
    base = orig_ctx or n_ctx_train
    if kind == "none":
        return Rope("none", 0.0, base, orig_ctx)
    if not scale and kind in STRETCH and base and n_ctx > base:
        scale = n_ctx / base
    return Rope(kind, scale, base, orig_ctx)


def describe(rope: Rope, n_ctx: int) -> tuple[str, bool] | None:
    """The line the daemon logs about the window, and whether it is a warning; None when the
    window is within the trained one and nothing was asked (the line stays as it was)."""
    base, past = rope.base, bool(rope.base) and n_ctx > rope.base
    if 0 < rope.factor < 1:
        return f"window {n_ctx} tokens (rope scale x{rope.factor:g}: shrinks the positions, not stretches)", True
    if rope.scales:
        how = rope.kind or "rope scale"  # --rope-scale alone: the model's scaling type (linear by default)
        line = f"window {n_ctx} tokens ({how} x{rope.factor:g} over the trained {base})"
        reach = int(base * rope.factor)
        if n_ctx > reach:
            return line + f": positions past {reach} are untrained, quality degrades there", True
        return line, False
    if past:
        without = "with --rope-scaling none" if rope.kind == "none" else "without rope scaling"
        return (f"window {n_ctx} tokens is past the model's trained {base} {without}: quality degrades past "
                f"the trained window; --rope-scaling yarn stretches the positions to fit"), True
    if rope.kind:
        return f"window {n_ctx} tokens, within the trained {base}: --rope-scaling {rope.kind} stretches nothing", False
    return None


def hf_rope(rope: Rope, current: dict) -> dict:
    """A transformers config's `rope_parameters` (Llama's flat form) with `rope` applied.
    Without a stretch it is the model's own; --rope-scale alone keeps the model's scaling type
    and, for a model that declares none, stretches linearly, as llama.cpp does."""
    if rope.kind == "none":
        return {**current, "rope_type": "default"}
    if not rope.scales:
        return current
    kind = rope.kind or (current.get("rope_type") if current.get("rope_type") not in (None, "default") else "linear")
    out = {**current, "rope_type": kind, "factor": rope.factor}
    if kind == "yarn":
        out["original_max_position_embeddings"] = rope.base
    return out


def rope_key(rope: Rope) -> str:
    """The disk tier's key part for a stretched rope: keys are stored rotated, so a prefix
    computed under another stretch must never be restored ("" for the model's own: the
    entries written before rope scaling existed stay valid)."""
    if not rope.kind and not rope.factor:
        return ""
    return f"-rope-{rope.kind or 'model'}-{rope.factor:g}-{rope.orig_ctx}"
