"""`corral agent run`'s MCP gateway parses in a helper of the session's cgroup (issue 10).

The attack: the agent posts two ~1 MiB JSON-RPC bodies at once to the MCP
route (the SDK's parsing costs ~100x a body). What the host observes, from
the kernel: the gateway is a `helper_main mcp` process in the
`helpers-mcp` cgroup of the session's run cgroup, whose peak counter grows;
the `corral agent run` process's own high-water mark (VmHWM) does not.
Before, the gateway ran in the agent-run process: its VmHWM took the bodies.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from corral.agents import demo_mcp
from tests.integration.run.helpers import vm_hwm
from tests.integration.run.test_run_forward_helper import MCP_BOMB, MCP_BOMB_SCENARIO

from .conftest import require_cli

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
    pytest.mark.requires_npm,
    pytest.mark.slow,
    pytest.mark.timeout(150),
]

MiB = 1 << 20

#: `corral agent run` as a process of its own (its VmHWM is what is measured).
_AGENT_RUN = """
import json, sys
from corral.broker.mcp_policy import parse_mcp_policy
from corral.run.agent_run import run_agent
ws, state, scenario, policy = sys.argv[1:5]
run = run_agent("claude-code", "Do the task.", workspace=ws, provider="synthetic:" + scenario,
                mcp=parse_mcp_policy(json.loads(policy)), timeout_s=90, state_dir=state)
print(run.result.status, flush=True)
"""


def _gateway(parent: int) -> tuple[int, Path] | None:
    """(pid, memory cgroup directory) of the agent run's MCP gateway helper, if any."""
    try:
        kids = psutil.Process(parent).children(recursive=True)
    except psutil.Error:
        return None
    for kid in kids:
        try:
            if kid.cmdline()[2:4] != ["corral.run.helper_main", "mcp"]:
                continue
            for line in Path(f"/proc/{kid.pid}/cgroup").read_text().splitlines():
                _, ctrl, path = line.split(":", 2)
                if ctrl == "memory":
                    return kid.pid, Path("/sys/fs/cgroup/memory" + path)
        except (psutil.Error, OSError):
            continue
    return None


def _peak(cg: Path) -> int:
    try:
        return int((cg / "memory.max_usage_in_bytes").read_text())
    except OSError:
        return 0


def test_hostile_mcp_bodies_are_charged_to_the_session_not_to_agent_run(tmp_path: Path) -> None:
    require_cli("claude-code")
    ws, mcp_ws = tmp_path / "ws", tmp_path / "mcp-ws"
    ws.mkdir()
    mcp_ws.mkdir()
    scenario = tmp_path / "bomb.yaml"
    scenario.write_text(MCP_BOMB_SCENARIO.replace("BOMB_JSON", json.dumps(MCP_BOMB)))
    policy = {
        "servers": {
            "demo": {
                "command": ["python3", demo_mcp.PATH],
                "ro": [str(Path(demo_mcp.PATH).parent)],
                "workspace": str(mcp_ws),
            }
        }
    }
    argv = [sys.executable, "-c", _AGENT_RUN, str(ws), str(tmp_path / "state"), str(scenario)]
    proc = subprocess.Popen([*argv, json.dumps(policy)], stdout=subprocess.PIPE, text=True)
    armed = ws / "armed"
    gateway: tuple[int, Path] | None = None
    base_run = base_gw = peak_run = peak_gw = 0
    try:
        while proc.poll() is None:
            peak_run = max(peak_run, vm_hwm(proc.pid))
            gateway = gateway or _gateway(proc.pid)
            if not base_run and armed.exists():
                # The bomb is about to post; everything before is start-up.
                base_run = vm_hwm(proc.pid)
                base_gw = _peak(gateway[1]) if gateway else 0
            if gateway is not None:
                peak_gw = max(peak_gw, _peak(gateway[1]))
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    status = (ws / "bomb-status").read_text() if (ws / "bomb-status").exists() else None
    grew_run, grew_gw = peak_run - base_run, peak_gw - base_gw
    print(
        f"agent run VmHWM {base_run / MiB:.1f} -> {peak_run / MiB:.1f} MiB; gateway helper "
        f"{gateway} peak {base_gw / MiB:.1f} -> {peak_gw / MiB:.1f} MiB; bomb {status!r}; {out!r}"
    )
    assert status is not None and base_run > 0, "the agent never posted its bodies"
    assert gateway is not None, "the MCP gateway is not in a helper"
    assert "/corral/run-agent-" in str(gateway[1]) and gateway[1].name == "helpers-mcp"
    assert grew_gw >= 16 * MiB, f"the gateway helper's peak grew {grew_gw / MiB:.1f} MiB"
    assert grew_run < 4 * MiB, f"the agent run's VmHWM grew {grew_run / MiB:.1f} MiB"
