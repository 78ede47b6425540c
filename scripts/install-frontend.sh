#!/usr/bin/env bash
# Builds corral's compiled front end (src/corral/_frontend/frontend.c) for this interpreter and
# source tree and installs it as `corral` (default /usr/local/bin/corral as root, else
# ~/.local/bin/corral): ahead of the Python console script on a usual PATH. See README,
# "The fast path". Usage: scripts/install-frontend.sh [DEST]   (PYTHON=... to pick the interpreter)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$here/.venv/bin/python}"
exec "$python" -m corral.exec.frontend install "$@"
