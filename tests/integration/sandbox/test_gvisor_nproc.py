"""gVisor: a fork the sentry refuses at the pids limit is counted and journaled by the host.

The refusal happens inside gVisor (RLIMIT_NPROC in the sentry), where the
host cgroup's `pids.events` never sees it; the count comes from the
sentry's own fork-family log, read by corral from a pipe. The command
renames itself with newlines first, trying to split the sentry's lines so
that its refusals go unseen.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from .conftest import ExecFn

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]

GV = ("--backend", "gvisor")

_FORK = """
import ctypes, os, sys, time
# PR_SET_NAME: the sentry prints this name in front of each of its log lines.
ctypes.CDLL(None).prctl(15, b"a\\nb\\n X clone(", 0, 0, 0)
n = refused = 0
for i in range(int(sys.argv[1])):
    try:
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
        n += 1
    except OSError:
        refused += 1
        break
print("forked", n, "refused", refused, flush=True)
"""


def _pids_rows(journal: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(journal) as db:
        rows = db.execute(
            "SELECT decision, reason FROM observations WHERE reason LIKE '%at the pids limit'"
        )
        return [(str(d), str(r)) for d, r in rows]


def test_fork_refused_by_the_sentry_is_counted_and_journaled(
    corral_exec: ExecFn, tmp_path: Path
) -> None:
    journal = tmp_path / "j.sqlite"
    opts = (*GV, "--pids", "8", "--journal", str(journal))
    out = corral_exec("python3", "-c", _FORK, "20", opts=opts, timeout=90)
    assert out.code == 0, out.stderr
    assert out.stdout.split()[-1] == "1", out.stdout  # the sentry refused one fork
    hits = out.summary["pids_limit_hits"]
    assert isinstance(hits, int) and hits >= 1, out.summary
    rows = _pids_rows(journal)
    assert [d for d, _ in rows] == ["deny"], rows
    assert rows[0][1].startswith("fork refused"), rows


def test_no_refusal_no_hit(corral_exec: ExecFn) -> None:
    """Forks under the limit (the same hostile name) count nothing."""
    out = corral_exec("python3", "-c", _FORK, "3", opts=(*GV, "--pids", "8"), timeout=90)
    assert out.code == 0, out.stderr
    assert out.stdout.split()[-1] == "0", out.stdout
    assert out.summary["pids_limit_hits"] == 0, out.summary
