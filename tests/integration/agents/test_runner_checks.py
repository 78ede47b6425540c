"""run_agent refuses bad sessions before starting anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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


KILL_SCENARIO = """name: mcp-then-wait
turns:
  - calls: [{mcp: {server: demo, tool: write_marker, arguments: {name: marker, text: x}}}]
  - calls: [{shell: "sleep 60"}]
  - say: "done"
"""


@pytest.mark.requires_sandbox
@pytest.mark.requires_npm
def test_sigkill_of_corral_agent_run_leaves_no_mcp_server(tmp_path: Path) -> None:
    """An MCP server that outlives its stdin is still ended when corral dies by SIGKILL."""
    from corral.agents import demo_mcp

    from .conftest import require_cli

    require_cli("claude-code")
    ws, mcp_ws, tools = tmp_path / "ws", tmp_path / "mcp-ws", tmp_path / "mcp"
    for d in (ws, mcp_ws, tools):
        d.mkdir()
    demo = tools / "demo_mcp.py"
    demo.write_bytes(Path(demo_mcp.PATH).read_bytes())
    policy = {
        "servers": {
            "demo": {
                "command": ["/bin/sh", "-c", f"python3 {demo}; sleep 600"],
                "ro": [str(tools)],
                "workspace": str(mcp_ws),
            }
        }
    }
    (tmp_path / "mcp.json").write_text(json.dumps(policy))
    (tmp_path / "s.yaml").write_text(KILL_SCENARIO)
    argv = [sys.executable, "-m", "corral", "agent", "run", "claude-code", "-w", str(ws)]
    argv += ["--provider", f"synthetic:{tmp_path / 's.yaml'}", "--mcp", str(tmp_path / "mcp.json")]
    argv += ["--state-dir", str(tmp_path / "state"), "--", "go"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (mcp_ws / "marker").exists():
            assert time.monotonic() < deadline, "the MCP call never reached the server"
            assert proc.poll() is None, "corral agent run ended before the MCP call"
            time.sleep(0.05)
        assert _procs(demo)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while _procs(demo):
        assert time.monotonic() < deadline, f"left behind: pids {sorted(_procs(demo))}"
        time.sleep(0.05)


def _procs(marker: Path) -> dict[int, str]:
    """Host processes whose command line names `marker`."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if str(marker).encode() in cmd:
                out[int(entry)] = cmd.decode(errors="replace")
    return out
