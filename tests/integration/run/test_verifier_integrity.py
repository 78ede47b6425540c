"""M12: a module the agent plants in its workspace cannot change a check's verdict.

Checks run with the agent's snapshot as their working directory. Here the agent
writes `json.py` (which would exit 0 on import) next to its work; the check
`python3 -c 'import json; sys.exit(1)'` must still fail. Without corral's
PYTHONSAFEPATH the planted module would be imported first and pass the check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.run.store import Store
from tests.integration.run.helpers import corral, new_id, write_mission

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(90)]

PLANT = (
    "printf 'import os\\nos._exit(0)\\n' > json.py; "
    "mkdir -p sitecustomize && printf 'import os\\nos._exit(0)\\n' > sitecustomize/__init__.py; "
    "echo yes > fixed"
)


def test_planted_module_cannot_pass_a_failing_check(tmp_path: Path) -> None:
    mission = write_mission(
        tmp_path / "m",
        max_sessions=1,
        check_cmd="python3 -c 'import json, sys; sys.exit(1)'",
    )
    scenario = tmp_path / "m" / "scenario.yaml"
    scenario.write_text(
        f'name: plant\nturns:\n  - calls: [{{shell: "{PLANT}"}}]\n  - say: "planted"\n'
    )
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
    # The agent really did its part: the other checks see its work.
    assert results["served"].passed, proc.stdout + proc.stderr
    assert (run_dir / "workspace" / "json.py").exists() or any(run_dir.rglob("json.py"))
    assert not results["fixed"].passed
    assert proc.returncode == 1
