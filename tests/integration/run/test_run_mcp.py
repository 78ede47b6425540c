"""`corral run` wires the mission's MCP servers: gateway, policy, own sandbox, journal, teardown.

The agent (the script test agent here; Claude Code in test_run_real_agents.py)
calls the demo MCP server through the broker's `mcp` route. Asserted on the
host: the tool's effect in the server's own directory, the journal's allowed
and denied calls, the server process's namespaces and cgroup (seen from the
host's /proc, never from what the server says), and that no process of the
server survives the run, or a SIGKILL of the coordinator.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from corral.agents import demo_mcp
from corral.broker.journal import read_rows
from corral.run.store import Store
from tests.integration.run.helpers import (
    in_phase,
    journal_events,
    new_id,
    run_cgroup,
    start_corral,
    wait_for,
)

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(90)]

SCENARIO = """name: mcp-in-run
turns:
  - calls:
      - mcp: {server: demo, tool: write_marker, arguments: {name: marker, text: from-the-agent}}
  - calls: [{mcp: {server: demo, tool: shred, arguments: {path: /}}}]
  - calls: [{mcp: {server: demo, tool: echo, arguments: {text: hello from corral}}}]
  - calls: [{shell: "while [ ! -f release ]; do sleep 0.05; done; echo ok > fixed"}]
  - say: "done"
"""

MISSION = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = 1

[session]
wall_time = "60s"

[mcp.servers.demo]
command = "/bin/sh"
args = ["-c", "python3 DEMO; TAIL"]
ro = ["mcp"]
deny_tools = ["shred"]

[[checks]]
name = "fixed"
run = "test -f fixed"
+++
# MCP in a run
"""


def _mission(root: Path, *, tail: str = "true") -> tuple[Path, Path]:
    """The mission and its own copy of the demo server (its path marks its processes)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "mcp").mkdir()
    demo = root / "mcp" / "demo_mcp.py"
    shutil.copyfile(demo_mcp.PATH, demo)
    (root / "scenario.yaml").write_text(SCENARIO)
    (root / "MISSION.md").write_text(MISSION.replace("DEMO", str(demo)).replace("TAIL", tail))
    return root / "MISSION.md", demo


def _procs(marker: Path) -> dict[int, str]:
    """Host processes whose command line names `marker` (corral exec, bwrap, the server)."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(marker) in cmd:
            out[int(entry)] = cmd
    return out


def _server_pid(marker: Path) -> int | None:
    for pid, cmd in _procs(marker).items():
        if cmd.startswith("python3 ") or cmd.startswith("/usr/bin/python3 "):
            return pid
    return None


def _ns(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def _cgroup(pid: int | str) -> str:
    with open(f"/proc/{pid}/cgroup") as fh:
        return fh.read()


def test_mission_mcp_server_is_wired_sandboxed_journaled_and_stopped(tmp_path: Path) -> None:
    mission, demo = _mission(tmp_path / "m")
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    proc = start_corral(
        "run",
        str(mission),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: in_phase(run_dir, 1, "agent"), 30, "session 1")
        wait_for((run_dir.parent / ".mcp" / rid / "session-1/demo/marker").exists, 40, "marker")
        pid = _server_pid(demo)
        assert pid is not None, "the MCP server is not running while the session is"
        # Its own sandbox: other namespaces and another cgroup than the host's.
        for kind in ("mnt", "pid", "net", "user"):
            assert _ns(pid, kind) != _ns("self", kind), kind
        assert _cgroup(pid) != _cgroup("self")
        (run_dir / "workspace" / "release").write_text("go")
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "passed"
    # The allowed call reached the server; the denied one did not.
    server_dir = run_dir.parent / ".mcp" / rid / "session-1" / "demo"
    assert (server_dir / "marker").read_text() == "from-the-agent"
    assert not (server_dir / "shred-called").exists()
    calls = (server_dir / "calls.log").read_text()
    assert "write_marker" in calls and "echo" in calls and "shred" not in calls
    rows = read_rows(run_dir / "journal.sqlite", kind="mcp_call")
    by_tool = {r.target: r for r in rows}
    assert by_tool["demo/write_marker"].decision == "allow"
    assert by_tool["demo/echo"].decision == "allow"
    assert by_tool["demo/shred"].decision == "deny"
    assert by_tool["demo/shred"].rule == "mcp:demo:deny"
    assert {r.run for r in rows} == {rid} and {r.session for r in rows} == {"1"}
    # The server's own sandbox is journaled under the session too.
    exits = {
        (r.session, r.env)
        for r in read_rows(run_dir / "journal.sqlite", kind="process_event")
        if r.target.startswith("exit") and r.run == rid
    }
    assert ("1", "exec") in exits and ("1", "agent") in exits
    assert journal_events(run_dir / "journal.sqlite", "session_end") == [
        ("1", "the session ended: agent finished")
    ]
    # Nothing of the server is left, and the run's cgroup is gone.
    assert _procs(demo) == {}
    assert not run_cgroup(rid).exists()


def test_sigkill_of_the_coordinator_leaves_no_mcp_server(tmp_path: Path) -> None:
    # A server that outlives its stdin (the gateway's end of the pipe closes
    # with the coordinator): only corral can end it.
    mission, demo = _mission(tmp_path / "m", tail="sleep 600")
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    proc = start_corral(
        "run",
        str(mission),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    try:
        wait_for((run_dir.parent / ".mcp" / rid / "session-1/demo/marker").exists, 60, "marker")
        assert _procs(demo)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Without `corral resume`: the server's sandbox is torn down on its own.
    wait_for(lambda: not _procs(demo), 30, "every process of the MCP server to end")


CLAUDE_SCENARIO = """name: claude-mcp-in-run
turns:
  - calls:
      - mcp: {server: demo, tool: write_marker, arguments: {name: marker, text: from-claude}}
  - calls: [{mcp: {server: demo, tool: shred, arguments: {path: /}}}]
  - calls: [{shell: "while [ ! -f release ]; do sleep 0.05; done; echo ok > fixed"}]
  - say: "done"
"""


@pytest.mark.requires_npm
@pytest.mark.slow
def test_claude_code_calls_a_mission_mcp_tool_through_the_gateway(tmp_path: Path) -> None:
    from corral.agents.install import executable_path
    from corral.agents.registry import ADAPTERS
    from corral.run.agent_port import tools_dir

    if not executable_path(ADAPTERS["claude-code"], tools_dir()).exists():
        reason = "claude-code is not installed: run scripts/install-agents.sh claude-code"
        if os.environ.get("CORRAL_REQUIRE_ALL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    mission, demo = _mission(tmp_path / "m")
    (tmp_path / "m" / "scenario.yaml").write_text(CLAUDE_SCENARIO)
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    server_dir = run_dir.parent / ".mcp" / rid / "session-1" / "demo"
    proc = start_corral(
        "run",
        str(mission),
        "--agent",
        "claude-code",
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    try:
        wait_for((server_dir / "marker").exists, 60, "the MCP tool's marker")
        pid = _server_pid(demo)
        assert pid is not None, "the MCP server is not running while the session is"
        for kind in ("mnt", "pid", "net", "user"):
            assert _ns(pid, kind) != _ns("self", kind), kind
        assert _cgroup(pid) != _cgroup("self")
        wait_for(lambda: in_phase(run_dir, 1, "agent"), 5, "session 1 still running")
        wait_for(
            lambda: len(read_rows(run_dir / "journal.sqlite", kind="mcp_call")) >= 2, 60, "2 calls"
        )
        (run_dir / "workspace" / "release").write_text("go")
        assert proc.wait(80) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "passed" and s.run().agent == "claude-code"
    assert (server_dir / "marker").read_text() == "from-claude"
    assert not (server_dir / "shred-called").exists()
    rows = read_rows(run_dir / "journal.sqlite", kind="mcp_call")
    decisions = {(r.target, r.decision, r.rule) for r in rows}
    assert ("demo/write_marker", "allow", "mcp:demo") in decisions
    assert ("demo/shred", "deny", "mcp:demo:deny") in decisions
    assert _procs(demo) == {}
    assert not run_cgroup(rid).exists()
