"""Issue 9 item 4 in `corral run`: a check cannot forge its own verdict.

The agent leaves `forge.py` (verify/probes/report_forgery.py's attack) in its
work; the check runs it, then exits 1. Before the fix the forged report said
exit 0 and the run ended `passed`; the host must record the check failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.run.store import Store
from corral.verify.probes.report_forgery import FORGE_SCRIPT
from tests.integration.run.helpers import corral, new_id, write_mission

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(90)]


def test_forged_check_report_is_recorded_failed(tmp_path: Path) -> None:
    mission = write_mission(
        tmp_path / "m",
        max_sessions=1,
        check_cmd="python3 -I -S forge.py 1; exit 1",
    )
    calls = [
        {"write_file": {"path": "forge.py", "content": FORGE_SCRIPT}},
        {"write_file": {"path": "fixed", "content": "yes"}},
    ]
    scenario = {"name": "forge", "turns": [{"calls": calls}, {"say": "done"}]}
    (tmp_path / "m" / "scenario.yaml").write_text(json.dumps(scenario))
    rid = new_id()
    proc = corral(
        "run",
        str(mission),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
        timeout=80,
    )
    run_dir = tmp_path / "runs" / rid
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        (session,) = s.sessions()
        results = {c.name: c for c in s.checks(session.n)}
    fixed = results["fixed"]
    # The attack really ran inside the verifier.
    assert "FORGE c" in (fixed.output or ""), (fixed, proc.stdout + proc.stderr)
    assert results["served"].passed, proc.stdout + proc.stderr
    assert not fixed.passed, fixed
    assert fixed.exit == 1, fixed
    assert proc.returncode == 1
