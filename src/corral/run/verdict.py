"""A check's verdict and its reason line (pure but for one bounded read).

The verdict is the host's: the verifier sandbox's exit as its backend
reports it (`ExecResult`), never anything the sandbox wrote. The reason
line is the sandbox's (`_payload/check_run.py` writes it into the check's
own scratch directory, which an agent-written program run by that check can
rewrite): read bounded, cut to its first line, escaped, so one check's
reason can never add a row, a verdict or a terminal control to what the
report and `corral status` show of another.
"""

from __future__ import annotations

from pathlib import Path

from corral.display import show
from corral.sandbox.spec import ExecResult

__all__ = ["REASON_LIMIT", "check_outcome", "read_reason"]

#: Characters of a check's reason line shown (report.md, status, the next prompt).
REASON_LIMIT = 200
_READ = 4096


def read_reason(path: Path) -> str:
    """The first line of the sandbox's reason file, escaped and bounded; "" if none."""
    try:
        with path.open("rb") as f:
            raw = f.read(_READ)
    except OSError:
        return ""
    first = raw.split(b"\n", 1)[0].strip()
    return show(first, REASON_LIMIT)


def check_outcome(result: ExecResult, timeout_s: float, sandbox_reason: str) -> tuple[bool, str]:
    """(passed, reason): passed only when the sandbox exited 0 by itself."""
    if result.reason == "timeout":
        return False, f"timed out after {timeout_s:g}s"
    if result.reason == "oom":
        return False, "killed by the check's memory limit"
    passed = result.reason == "exited" and result.exit == 0
    if passed:
        return True, "passed"
    if result.reason != "exited" or not sandbox_reason:
        return False, f"exit {result.exit} ({result.reason})"
    return False, show(sandbox_reason, REASON_LIMIT)
