#!/usr/bin/env bash
# The coding agents tests/integration/test_agents.py drives through `superfluid launch`, pinned:
# installed from npm (each ships its native binary in the package) when the pinned version is
# missing. Idempotent: nothing happens when they are there. Needs node and npm.
set -euo pipefail
pins=("@openai/codex@0.169.0" "@anthropic-ai/claude-code@2.1.197" "opencode-ai@1.18.33"
      "@mariozechner/pi-coding-agent@0.73.1")
missing=()
for p in "${pins[@]}"; do
  npm ls -g --depth=0 "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]}" >&2
  npm install -g --no-fund --no-audit "${missing[@]}"
fi
