"""Real agent CLIs (from npm) inside corral, driven by the synthetic provider.

Each test runs the pinned CLI as an unprivileged uid in a namespace sandbox
whose only way out is the broker: the provider route and the MCP gateway
route. The assertions are on effects: files in the workspace, the MCP
server's own marker, the journal, and the provider's record of what it
received.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.broker.mcp_policy import McpPolicy
from corral.run.agent_run import AgentRun, run_agent

from .conftest import REPO_SCENARIOS, SCENARIOS, require_cli, rows, transcript

AGENTS = ["claude-code", "codex"]

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_npm, pytest.mark.slow]


def _run(
    agent: str,
    scenario: Path,
    workspace: Path,
    state: Path,
    *,
    policy: McpPolicy | None = None,
    timeout_s: float = 45,
    environ: dict[str, str] | None = None,
) -> AgentRun:
    require_cli(agent)
    return run_agent(
        agent,
        "Do the task.",
        workspace=workspace,
        provider=f"synthetic:{scenario}",
        mcp=policy,
        timeout_s=timeout_s,
        state_dir=state,
        environ=environ,
    )


def _only_brokered_traffic(run: AgentRun) -> None:
    """Every request reached the provider through the broker, and nothing else left."""
    journal = rows(run.journal)
    kinds = {r.kind for r in journal}
    assert kinds <= {"provider_call", "mcp_call", "process_event"}, kinds
    denied = [(r.kind, r.target, r.reason) for r in journal if r.decision == "deny"]
    assert denied == []
    via_route = [
        r for r in journal if r.kind == "provider_call" and r.target.startswith("synthetic ")
    ]
    assert len(via_route) == len(transcript(run.state_dir)) > 0
    routes = {r.target.split(" ", 1)[0] for r in journal if r.kind == "provider_call"}
    assert routes <= {"synthetic", "mcp"}


@pytest.mark.parametrize("agent", [*AGENTS, "gemini"])
def test_shell_edit_and_mcp_inside_corral(
    agent: str, workspace: Path, state: Path, mcp_workspace: Path, demo_policy: McpPolicy
) -> None:
    run = _run(agent, SCENARIOS / "shell-edit-mcp.yaml", workspace, state, policy=demo_policy)
    assert run.result.status == "succeeded", (run.result, (state / "agent.stderr").read_text())
    assert run.result.text == "DONE: shell, edit and MCP all worked."
    assert (workspace / "hello.txt").read_text(encoding="utf-8") == "hi\n"
    assert (workspace / "notes.md").read_text(encoding="utf-8") == "written by the edit tool\n"
    # The MCP server (in its own sandbox) really ran the call.
    assert (mcp_workspace / "agent-marker").read_text(encoding="utf-8") == "from the agent"
    # Files the agent created belong to the caller on the host, not to the sandbox uid.
    assert (workspace / "hello.txt").stat().st_uid == os.getuid()
    journal = rows(run.journal)
    mcp_calls = [(r.target, r.decision) for r in journal if r.kind == "mcp_call"]
    assert mcp_calls == [("demo/write_marker", "allow")]
    assert run.result.usage.total > 0
    assert run.sandbox is not None and run.sandbox["reason"] == "exited"
    _only_brokered_traffic(run)


@pytest.mark.parametrize("agent", [*AGENTS, "gemini"])
def test_edit_intent_changes_the_file_with_the_clients_edit_tool(
    agent: str, workspace: Path, state: Path
) -> None:
    run = _run(agent, SCENARIOS / "edit-file.yaml", workspace, state)
    assert run.result.status == "succeeded", (run.result, (state / "agent.stderr").read_text())
    # The host-side effect: the edit reached the file (Gemini's replace refuses
    # a call without its required `instruction` and leaves the file as it was).
    assert (workspace / "conf.py").read_text(encoding="utf-8") == "LEVEL = 2\nNAME = 'x'\n"
    assert [t.ok for t in run.result.tool_calls] == [True, True], run.result.tool_calls
    _only_brokered_traffic(run)


@pytest.mark.parametrize("agent", AGENTS)
def test_denied_mcp_tool_is_refused_and_journaled(
    agent: str, workspace: Path, state: Path, mcp_workspace: Path, demo_policy: McpPolicy
) -> None:
    run = _run(agent, SCENARIOS / "mcp-denied.yaml", workspace, state, policy=demo_policy)
    assert run.result.text == "DENIED: the gateway refused the call.", run.result
    assert not (mcp_workspace / "shred-called").exists()
    denied = [r for r in rows(run.journal) if r.kind == "mcp_call"]
    assert [(r.target, r.decision, r.rule) for r in denied] == [
        ("demo/shred", "deny", "mcp:demo:deny")
    ]


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize(
    "scenario",
    [REPO_SCENARIOS / "failing-provider.yaml", SCENARIOS / "truncated-stream.yaml"],
    ids=["http-529", "truncated"],
)
def test_broken_provider_fails_fast(
    agent: str, scenario: Path, workspace: Path, state: Path
) -> None:
    run = _run(agent, scenario, workspace, state, timeout_s=240)
    # No retry loop: the CLI gave up by itself ("failed", not the limit's
    # "timeout") after a few requests, counted by the provider.
    assert run.result.status == "failed", run.result
    assert run.result.error
    assert len(transcript(run.state_dir)) <= 3


@pytest.mark.parametrize("agent", AGENTS)
def test_silent_provider_hits_the_wall_clock_limit(
    agent: str, workspace: Path, state: Path
) -> None:
    run = _run(agent, SCENARIOS / "slow-provider.yaml", workspace, state, timeout_s=6)
    # The limit's own verdict; pytest's timeout bounds a hang.
    assert run.result.status == "timeout", run.result


def test_host_credentials_do_not_reach_the_agent(workspace: Path, state: Path) -> None:
    canary = "sk-ant-canary-5d1c"
    environ = {**os.environ, "ANTHROPIC_API_KEY": canary, "OPENAI_API_KEY": canary}
    run = _run("claude-code", SCENARIOS / "env-dump.yaml", workspace, state, environ=environ)
    assert run.result.status == "succeeded", run.result
    dumped = (workspace / "env.txt").read_text(encoding="utf-8")
    assert "ANTHROPIC_API_KEY=corral-brokered" in dumped
    assert canary not in dumped
    assert "HOME=/home/corral" in dumped


@pytest.mark.parametrize("agent", AGENTS)
def test_an_mcp_server_that_cannot_start_stops_the_run(
    agent: str, workspace: Path, state: Path
) -> None:
    from corral.broker.mcp_policy import parse_mcp_policy
    from corral.errors import AgentError

    require_cli(agent)
    policy = parse_mcp_policy({"servers": {"broken": {"command": ["/bin/false"]}}})
    with pytest.raises(AgentError, match="broken") as refused:
        _run(agent, SCENARIOS / "shell-edit-mcp.yaml", workspace, state, policy=policy)
    # From the server's exit, not from a start-up bound running out ("within N s"),
    # and before the agent ran: the provider never saw a request.
    assert "within" not in str(refused.value), refused.value
    assert transcript(state) == []
    assert not (workspace / "hello.txt").exists()
