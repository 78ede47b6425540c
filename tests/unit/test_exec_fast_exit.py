"""`corral exec` leaves without the interpreter's shutdown, losing nothing (issue 13)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _env() -> dict[str, str]:
    # Block-buffered streams, as a user's shell gives a piped corral.
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_env(),
    )


def test_buffered_output_is_flushed_and_status_kept() -> None:
    # Piped stdout is block-buffered: without the flush the text is lost.
    r = _run(
        "import sys; from corral.cli import _exit_now; "
        "sys.stdout.write('out-line\\n'); sys.stderr.write('err-line\\n'); _exit_now(7)"
    )
    assert (r.returncode, r.stdout, r.stderr) == (7, "out-line\n", "err-line\n")


def test_atexit_handlers_still_run() -> None:
    r = _run(
        "import atexit, sys; from corral.cli import _exit_now; "
        "atexit.register(lambda: print('handler ran')); _exit_now(3)"
    )
    assert (r.returncode, r.stdout) == (3, "handler ran\n")


def test_live_thread_is_joined() -> None:
    r = _run(
        "import threading, time; from corral.cli import _exit_now; "
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start(); "
        "_exit_now(0)"
    )
    assert (r.returncode, r.stdout) == (0, "thread done\n")


def test_dry_run_output_complete_through_a_pipe(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "exec",
            "--dry-run",
            "--workspace",
            str(tmp_path),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_env(),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("bwrap ") or "bwrap" in r.stdout.split()[0], r.stdout[:200]
    assert r.stdout.endswith("\n")
