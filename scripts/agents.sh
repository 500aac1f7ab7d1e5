#!/usr/bin/env bash
# The coding agents tests/integration/test_agents.py drives through `superfluid launch`, pinned:
# installed from npm (each ships its native binary in the package) when the pinned version is
# missing. Idempotent: nothing happens when they are there. Needs node and npm.
set -euo pipefail
pins=("@openai/codex@0.169.0" "@anthropic-ai/claude-code@2.1.197" "opencode-ai@1.18.33"
      "@mariozechner/pi-coding-agent@0.73.1" "cline@3.0.65")
missing=()
for p in "${pins[@]}"; do
  npm ls -g --depth=0 "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]}" >&2
  npm install -g --no-fund --no-audit "${missing[@]}"
fi

# Hermes Agent (PyPI), in a virtual environment of its own (its pins are not ours), linked
# onto PATH as `hermes`
hermes_pin="0.19.0"
venv="${HERMES_VENV:-$HOME/.local/share/superfluid-agents/hermes}"
if ! "$venv/bin/python" -m pip show hermes-agent 2>/dev/null | grep -qx "Version: $hermes_pin"; then
  echo "installing hermes-agent==$hermes_pin into $venv" >&2
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "hermes-agent==$hermes_pin"
fi
if [ -w /usr/local/bin ]; then bin=/usr/local/bin; else bin="$HOME/.local/bin"; mkdir -p "$bin"; fi
ln -sf "$venv/bin/hermes" "$bin/hermes"
command -v hermes >/dev/null || echo "note: $bin is not on PATH; hermes is at $venv/bin/hermes" >&2
