"""`corral status` shows agent and start time, readable at 80 and 200 columns and piped."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.cli.ptyterm import plain, run_in_pty, run_piped

pytestmark = [pytest.mark.timeout(60)]

REASON = "check 'api' failed: status 501, expected 201"
RUN_ID = "todo-api-20261201-102107-ab12"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    with Store(run_dir / "state.sqlite") as store:
        store.create_run(
            RUN_ID,
            mission="m",
            agent="claude-code",
            provider="anthropic",
            max_sessions=3,
            memory_cap=4 << 30,
        )
        store.begin_session(1)
        store.end_session(1, state="done", end_reason=REASON, run_peak_memory=0)
        store.update_run(state="exhausted", end_reason=REASON)
    return tmp_path / "runs"


@pytest.mark.parametrize("columns", [80, 200])
def test_terminal_shows_agent_start_and_reason_whole(runs: Path, columns: int) -> None:
    rc, out = run_in_pty(["status", "--runs-dir", str(runs)], columns)
    assert rc == 0, out
    lines = plain(out).splitlines()
    assert max(len(line) for line in lines) <= columns
    for value in (RUN_ID, "claude-code", "exhausted", "1/3", "2026-", REASON):
        assert any(value in line for line in lines), (value, out)


def test_piped_is_one_line_a_run(runs: Path) -> None:
    result = run_piped(["status", "--runs-dir", str(runs)])
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith(f"run={RUN_ID} agent=claude-code started=2026-")
    assert "state=exhausted session=1/3 checks=0/0 allowed=0 denied=0" in line
    assert f'memory="0/4096 MiB" ended="{REASON}"' in line
