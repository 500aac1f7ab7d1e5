"""Print the package's layout as docs/architecture.md lists it: each package of the import
contract's layers (pyproject.toml), top to bottom, with its modules and lines counted from
the code.   python scripts/layout.py"""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in cfg if c["type"] == "layers"]
    print("| layer | package | modules | lines |\n|---|---|---:|---:|")
    for i, layer in enumerate(layers, 1):
        for name in (m.strip() for m in layer.split("|")):
            rel = name.replace(".", "/")
            files = sorted((ROOT / rel).rglob("*.py")) if (ROOT / rel).is_dir() else [ROOT / f"{rel}.py"]
            lines = sum(len(f.read_text().splitlines()) for f in files)
            shown = name.removeprefix("superfluid.") + ("/" if (ROOT / rel).is_dir() else "")
            print(f"| {i} | `{shown}` | {len(files)} | {lines} |")


if __name__ == "__main__":
    main()
