"""M5: every process a task started is gone when `corral exec` returns.

Each test starts daemons that try hard to outlive the task (setsid + double
fork, nohup, a process reparented to the sandbox's pid 1, one ignoring
SIGTERM) with a unique marker in their command line, then looks for the
marker from the host.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import ExecFn, corral_argv, processes_with, wait_for

pytestmark = [pytest.mark.requires_sandbox]


def _script(workspace: Path, marker: str, tail: str) -> Path:
    """A shell script that starts four kinds of would-be survivors."""
    py = "import signal,time,sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"
    script = workspace / "spawn.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"setsid python3 -c '{py}' {marker}-setsid &\n"
        f"( ( python3 -c '{py}' {marker}-double & ) & )\n"
        f"nohup python3 -c '{py}' {marker}-nohup >/dev/null 2>&1 &\n"
        f"sh -c \"python3 -c '{py}' {marker}-orphan &\"\n"
        # wait until all four are running so none is killed before it started
        # ("[c]orral-..." keeps grep from counting its own command line); no
        # count of tries: on a loaded host four Python starts take seconds,
        # and the caller's own limits bound a hang
        f"while n=$(grep -l '[{marker[0]}]{marker[1:]}' /proc/[0-9]*/cmdline "
        "2>/dev/null | wc -l); "
        f'[ "$n" -lt 4 ]; do sleep 0.02; done\n'
        f"echo spawned\n{tail}\n"
    )
    script.chmod(0o755)
    return script


def test_daemons_gone_after_normal_exit(corral_exec: ExecFn, workspace: Path, marker: str) -> None:
    script = _script(workspace, marker, "exit 0")
    out = corral_exec("sh", str(script))
    assert out.code == 0, out.stderr
    assert "spawned" in out.stdout
    assert processes_with(marker) == []
    killed = out.summary["processes_killed_at_end"]
    assert isinstance(killed, int) and killed >= 4


def test_daemons_gone_after_timeout(corral_exec: ExecFn, workspace: Path, marker: str) -> None:
    script = _script(workspace, marker, "sleep 1000")
    # Long enough for the four survivors to start on a loaded host first.
    out = corral_exec("sh", str(script), opts=("--timeout", "10"))
    assert out.code == 124, out.stderr
    assert "spawned" in out.stdout
    # The kill came from the limit (reason), not from the command ending:
    # how long a loaded host took around it decides nothing.
    assert out.summary["reason"] == "timeout"
    assert processes_with(marker) == []
    killed = out.summary["processes_killed_at_end"]
    assert isinstance(killed, int) and killed >= 5


def test_daemons_gone_when_corral_is_sigkilled(workspace: Path, marker: str) -> None:
    script = _script(workspace, marker, "sleep 1000")
    with subprocess.Popen(
        corral_argv("--workspace", str(workspace), "--", "sh", str(script)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"spawned"
        assert len(processes_with(marker)) >= 4
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert wait_for(lambda: processes_with(marker) == [], timeout=10), processes_with(marker)


def test_sigterm_to_corral_kills_the_sandbox(workspace: Path, marker: str) -> None:
    script = _script(workspace, marker, "sleep 1000")
    with subprocess.Popen(
        corral_argv("--workspace", str(workspace), "--", "sh", str(script)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"spawned"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 128 + signal.SIGTERM
    assert processes_with(marker) == []


def test_no_cgroup_left_behind(corral_exec: ExecFn) -> None:
    """The sandbox's cgroup is removed when `corral exec` returns.

    Other sandboxes may be running concurrently, so only cgroups whose owner
    (the corral process named in the cgroup's name) has exited count as leaks.
    """
    from corral.sandbox.cgroup import detect_layout

    layout = detect_layout()
    assert layout is not None
    root = dict(layout.v1).get("pids") or layout.unified
    assert root is not None
    parent = os.path.join(root, "corral")

    def leaked() -> set[str]:
        if not os.path.isdir(parent):
            return set()
        out = set()
        for name in os.listdir(parent):
            parts = name.split("-")
            if len(parts) == 3 and parts[1].isdigit() and not os.path.exists(f"/proc/{parts[1]}"):
                out.add(name)
        return out

    before = leaked()
    out = corral_exec("true")
    assert out.code == 0
    assert leaked() - before == set()
