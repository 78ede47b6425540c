"""run_agent refuses bad sessions before starting anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.errors import AgentError, UsageError
from corral.run.agent_run import run_agent

SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "write-file.yaml"


def test_state_dir_inside_the_workspace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="inside the workspace"):
        run_agent(
            "claude-code",
            "x",
            workspace=tmp_path,
            provider=f"synthetic:{SCENARIO}",
            state_dir=tmp_path / ".corral",
        )
    assert not (tmp_path / ".corral").exists()


def test_real_provider_needs_the_sandbox_and_the_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    with pytest.raises(UsageError, match="ANTHROPIC_API_KEY"):
        run_agent("claude-code", "x", workspace=tmp_path, provider="anthropic", environ=env)
    with pytest.raises(UsageError, match="only used inside corral"):
        run_agent(
            "claude-code",
            "x",
            workspace=tmp_path,
            provider="anthropic",
            sandbox=False,
            environ={**env, "ANTHROPIC_API_KEY": "sk-x"},
        )
    with pytest.raises(UsageError, match="use --provider openai"):
        run_agent("codex", "x", workspace=tmp_path, provider="anthropic")


def test_missing_cli_is_named(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(AgentError, match=r"install-agents\.sh codex"):
        run_agent(
            "codex",
            "x",
            workspace=ws,
            provider=f"synthetic:{SCENARIO}",
            tools_dir=tmp_path / "no-tools",
            state_dir=tmp_path / "state",
        )


@pytest.mark.requires_sandbox
@pytest.mark.requires_npm
def test_the_defaults_work_together(tmp_path: Path) -> None:
    """`corral agent run` with no --workspace and no --state-dir, from the project directory:
    the session runs (its state lands outside the workspace, where the agent cannot reach it)."""
    from .conftest import require_cli

    require_cli("claude-code")
    ws = tmp_path / "project"
    ws.mkdir()
    xdg = tmp_path / "xdg-state"
    argv = [sys.executable, "-m", "corral", "agent", "run", "claude-code", "--json"]
    argv += ["--provider", f"synthetic:{SCENARIO}", "--timeout", "60", "--", "Create hello.txt"]
    proc = subprocess.run(
        argv,
        cwd=ws,
        env={**os.environ, "XDG_STATE_HOME": str(xdg)},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (ws / "hello.txt").read_text() == "hi\n"
    assert sorted(p.name for p in ws.iterdir()) == ["hello.txt"]  # no state in the workspace
    out = json.loads(proc.stdout)
    state = Path(out["state_dir"])
    assert state.parent == xdg / "corral" / "agent"
    assert (state / "journal.sqlite").is_file() and (state / "result.json").is_file()
