"""`_payload/check_run.py` does not count the run's paused time against a check's timeout.

The runner is frozen with the run and its own timers run on; it learns of
the pauses from the host's `pauses.json` next to it. Here the record says
the run is paused (as it does while frozen, until the thaw is recorded), so
a check longer than its timeout is let finish; the control, with no record
or only a pause that ended before the check began, times it out.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from corral._payload import path as payload_path


def _run_check(tmp_path: Path, pauses: list[list[float | None]] | None) -> tuple[int, str]:
    runner = tmp_path / "check_run.py"
    shutil.copyfile(payload_path("check_run.py"), runner)
    if pauses is not None:
        (tmp_path / "pauses.json").write_text(json.dumps(pauses))
    reason = tmp_path / "reason.txt"
    doc = {"main": ["/bin/sh", "-c", "sleep 1"], "timeout": 0.4, "reason": str(reason)}
    proc = subprocess.run(
        [sys.executable, "-I", str(runner), json.dumps(doc)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return proc.returncode, reason.read_text().strip()


def test_a_check_is_not_timed_out_while_the_record_says_paused(tmp_path: Path) -> None:
    assert _run_check(tmp_path, [[time.monotonic() - 1.0, None]]) == (0, "passed")


def test_control_without_the_record_the_check_times_out(tmp_path: Path) -> None:
    assert _run_check(tmp_path, None) == (124, "timed out after 0.4s")


def test_a_pause_before_the_check_began_does_not_lengthen_it(tmp_path: Path) -> None:
    now = time.monotonic()
    assert _run_check(tmp_path, [[now - 100.0, now - 50.0]]) == (124, "timed out after 0.4s")


def test_a_record_that_is_not_json_counts_nothing(tmp_path: Path) -> None:
    (tmp_path / "pauses.json").write_text("{{{")
    assert _run_check(tmp_path, None) == (124, "timed out after 0.4s")
