#!/usr/bin/env bash
# Builds corral's virtualenv (`make venv`), printing a line per phase and per package
# so the ~90 s pip takes on a fresh machine is not silent.
set -euo pipefail

python="${1:-python3}"
venv="${2:-.venv}"
started=$SECONDS

phase() { echo "venv: [$1/3] $2"; }

phase 1 "creating $venv with $python"
test -x "$venv/bin/python" || "$python" -m venv "$venv"
phase 2 "upgrading pip"
"$venv/bin/python" -m pip install -q --upgrade pip
phase 3 "installing corral and its dev tools (about 90 s on a fresh machine)"
# One line per package pip collects; everything else it says only on failure.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! "$venv/bin/python" -m pip install --progress-bar off -e '.[dev]' >"$log" 2>&1 \
    < /dev/null; then
  cat "$log" >&2
  echo "venv: pip install failed (output above)" >&2
  exit 1
fi &
pid=$!
seen=0
report() {
  local total
  total=$(grep -c '^Collecting ' "$log" || true)
  if [ "$total" -gt "$seen" ]; then
    grep '^Collecting ' "$log" | sed -n "$((seen + 1)),${total}p" | sed 's/^Collecting /  collecting /'
    seen=$total
  fi
}
while kill -0 "$pid" 2>/dev/null; do
  report
  sleep 1
done
wait "$pid"
report
echo "venv: ready in $((SECONDS - started)) s ($seen packages)"
