"""The layout the import contract and docs/architecture.md describe: every module of the
package is in a layer of the contract (so `lint-imports` sees an upward import anywhere),
and no source file is over 400 lines (DESIGN.md, Style)."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_LINES = 400


def layers() -> list[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in cfg if c["type"] == "layers"]
    return [m.strip() for layer in contract["layers"] for m in layer.split("|")]


def modules() -> list[str]:
    out = []
    for p in sorted((ROOT / "superfluid").rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def test_every_module_is_in_a_layer_of_the_import_contract():
    named = layers()
    outside = [m for m in modules() if m != "superfluid"
               and not any(m == n or m.startswith(n + ".") for n in named)]
    assert outside == []


def test_the_top_level_holds_the_vocabulary_only():
    top = sorted(p.stem for p in (ROOT / "superfluid").glob("*.py") if p.stem != "__init__")
    assert top == ["client", "config", "daemon", "errors", "ids", "limits", "plan", "request"]


def test_no_source_file_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for d in ("superfluid", "tests", "bench", "scripts")
            for p in (ROOT / d).rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
