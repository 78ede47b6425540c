"""Where runs live: the one resolver behind every run command's `--runs-dir`.

Order: `--runs-dir` if given, else `$CORRAL_RUNS_DIR`, else the nearest
`.corral/runs` in the working directory or any parent (as git finds `.git`),
else `.corral/runs` in the working directory (created by `corral run`).

A directory the user named (flag or variable) must exist and be a directory;
`corral run` may create it when its parent exists. Anything else is a
`UsageError` (one line, exit 2), never a traceback from deep inside.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from corral.errors import UsageError

__all__ = ["ENV_VAR", "RUNS_SUBDIR", "find_runs_dir", "resolve_runs_dir"]

ENV_VAR = "CORRAL_RUNS_DIR"
RUNS_SUBDIR = Path(".corral/runs")


def find_runs_dir(start: Path) -> Path | None:
    """The nearest `.corral/runs` directory at `start` or above it, if any."""
    here = start.absolute()
    for d in (here, *here.parents):
        candidate = d / RUNS_SUBDIR
        if candidate.is_dir():
            return candidate
    return None


def resolve_runs_dir(
    explicit: Path | None,
    *,
    create: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Path:
    """The runs directory a command uses (see the module docstring for the order)."""
    environ = os.environ if env is None else env
    named: Path | None = explicit
    source = "--runs-dir"
    if named is None and environ.get(ENV_VAR):
        named, source = Path(environ[ENV_VAR]), ENV_VAR
    base = Path.cwd() if cwd is None else cwd
    if named is None:
        return find_runs_dir(base) or base / RUNS_SUBDIR
    if not named.is_absolute():
        named = base / named
    if named.is_dir():
        return named
    if named.exists():
        raise UsageError(f"{source} {named} is not a directory")
    if create and named.parent.is_dir():
        return named
    raise UsageError(f"{source} {named} does not exist")
