"""End to end with the real Claude Code, Codex and Gemini CLIs (scripts/install-agents.sh).

The same examples and scenarios as with the script test agent: the synthetic
provider plays them to each CLI through the agent's broker route.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.agents.install import executable_path
from corral.agents.registry import ADAPTERS
from corral.run.agent_port import tools_dir
from corral.run.store import Store
from tests.integration.run.helpers import EXAMPLES, corral, journal_ok, new_id, run_cgroup

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_npm, pytest.mark.timeout(90)]


@pytest.mark.parametrize("example", ["todo-cli", "todo-api"])
@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini"])
def test_real_agent_passes_the_example_in_two_sessions(
    tmp_path: Path, agent: str, example: str
) -> None:
    if not executable_path(ADAPTERS[agent], tools_dir()).exists():
        reason = f"{agent} is not installed: run scripts/install-agents.sh {agent}"
        if os.environ.get("CORRAL_REQUIRE_ALL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    rid = new_id()
    proc = corral(
        "run",
        str(EXAMPLES / example / "MISSION.md"),
        "--agent",
        agent,
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
        timeout=80,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / rid
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "passed" and s.run().agent == agent
        s1, s2 = s.sessions()
    assert s1.checks_passed < s1.checks_total and s2.checks_passed == s2.checks_total
    assert s1.tokens > 0
    assert journal_ok(run_dir / "journal.sqlite")
    assert not run_cgroup(rid).exists()
