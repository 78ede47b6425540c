"""A run's session broker is given the run's pauses file (issue 10).

The broker's timers are on the run's clock only if the coordinator tells
it where the pauses are published; the broker's behaviour across a freeze
is `tests/integration/broker/test_pause_clock.py`. Judged from the
journal: each agent session's `broker_start` row names the run's
`tools/pauses.json` (the broker read it from its validated config).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.broker.journal import read_rows
from tests.integration.run.helpers import corral, new_id, write_mission

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(120)]


def test_each_agent_broker_of_a_run_reads_the_runs_pauses(tmp_path: Path) -> None:
    rid = new_id()
    mission = write_mission(tmp_path / "m")
    result = corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = (tmp_path / "runs" / rid).absolute()
    starts = [
        r
        for r in read_rows(run_dir / "journal.sqlite", kind="process_event")
        if r.target.startswith("broker_start") and r.env == "agent"
    ]
    assert [r.session for r in starts] == ["1", "2"]
    assert {r.detail.get("pauses") for r in starts} == {str(run_dir / "tools" / "pauses.json")}
