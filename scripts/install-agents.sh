#!/usr/bin/env bash
# Installs the pinned agent CLIs from npm into corral's tools folder (never globally).
#
#   scripts/install-agents.sh                 # claude-code, codex and gemini (what the tests need)
#   scripts/install-agents.sh gemini          # only the named ones
#   CORRAL_TOOLS=/opt/corral/tools scripts/install-agents.sh
#
# Each CLI gets its own prefix, <tools>/npm/<agent>/, so installing or upgrading
# one never touches another. Idempotent: an agent whose pinned version is already
# installed is skipped. The pins must match corral.agents (a unit test checks).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${CORRAL_TOOLS:-$here/tools}"

declare -A package=(
  [claude-code]="@anthropic-ai/claude-code"
  [codex]="@openai/codex"
  [gemini]="@google/gemini-cli"
)
declare -A version=(
  [claude-code]="2.1.332"
  [codex]="0.171.0"
  [gemini]="0.61.0"
)

command -v npm >/dev/null || { echo "install-agents: npm is not installed" >&2; exit 1; }

agents=("$@")
[ ${#agents[@]} -gt 0 ] || agents=(claude-code codex gemini)

for agent in "${agents[@]}"; do
  pkg="${package[$agent]:-}"
  ver="${version[$agent]:-}"
  if [ -z "$pkg" ]; then
    echo "install-agents: unknown agent '$agent' (known: ${!package[*]})" >&2
    exit 2
  fi
  prefix="$tools/npm/$agent"
  manifest="$prefix/node_modules/$pkg/package.json"
  if [ -f "$manifest" ] && grep -q "\"version\": *\"$ver\"" "$manifest"; then
    echo "$agent: $pkg@$ver already installed in $prefix"
    continue
  fi
  echo "$agent: installing $pkg@$ver into $prefix (npm is quiet; a minute on a fresh machine)"
  t0=$SECONDS
  mkdir -p "$prefix"
  # --no-fund/--no-audit: no extra registry traffic; --save-exact pins the lock file.
  npm install --prefix "$prefix" --save-exact --no-fund --no-audit --loglevel=error "$pkg@$ver"
  grep -q "\"version\": *\"$ver\"" "$manifest" || {
    echo "install-agents: $pkg@$ver did not install into $prefix" >&2
    exit 1
  }
  echo "$agent: installed in $((SECONDS - t0)) s"
done
