"""`corral exec --backend gvisor` through the compiled front end and the resident launcher.

The worker that runs a gVisor sandbox is a fork of the launcher, not the
caller: the caller's death must still take runsc, the sentry, the gofer and
everything the command started with it, and the outcome must be the Python
CLI's.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import corral_argv, processes_with, wait_for
from .test_launcher import Launcher, alive, children_of, frontend, launcher_proc

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]

__all__ = ["frontend", "launcher_proc"]

GV = ("--backend", "gvisor")


def _state_dirs(worker: int) -> list[str]:
    """runsc state directories of sandboxes that `worker` started (named after its pid)."""
    try:
        return [n for n in os.listdir("/run/corral-gvisor") if n.startswith(f"exec-{worker}-")]
    except FileNotFoundError:
        return []


def test_same_outcome_as_the_python_cli(
    frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    cmd = ("sh", "-c", "echo out; echo err >&2; cat; exit 7")
    outcomes = []
    for argv, env in (
        (corral_argv(*GV, "--", *cmd), dict(os.environ)),
        ([str(frontend), "exec", *GV, "--", *cmd], launcher_proc.env()),
    ):
        proc = subprocess.run(
            argv,
            input=b"from stdin\n",
            capture_output=True,
            cwd=workspace,
            env=env,
            timeout=120,
            check=False,
        )
        outcomes.append((proc.returncode, proc.stdout, proc.stderr))
    assert outcomes[0] == (7, b"out\nfrom stdin\n", b"err\n")
    assert outcomes[1] == outcomes[0]


def test_kill9_of_the_client_tears_the_gvisor_sandbox_down(
    frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    """A daemon the command started keeps writing to the workspace; kill -9 of
    the caller leaves no runsc process, no writer and no state on the host."""
    tick = workspace / "tick"
    daemon = (
        "setsid sh -c 'while :; do echo x >> tick; sleep 0.05; done' </dev/null >/dev/null 2>&1 &"
    )
    client = subprocess.Popen(
        [str(frontend), "exec", *GV, "--", "sh", "-c", daemon + " sleep 1000"],
        cwd=workspace,
        env=launcher_proc.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: list[int] = []

    def ticking() -> bool:
        workers[:] = launcher_proc.workers()
        return tick.exists() and tick.stat().st_size > 0

    assert wait_for(ticking, 60), "the daemon never ran"
    assert workers and children_of(workers[0]), "the sandbox is not the worker's"
    assert children_of(client.pid) == []
    names = [f"/run/corral-gvisor/{n}/" for w in workers for n in _state_dirs(w)]
    assert names and all(processes_with(n) for n in names)  # runsc, gofer, sentry
    client.kill()
    client.wait()
    assert wait_for(lambda: not any(alive(w) for w in workers), 30), "worker outlived its client"
    assert wait_for(lambda: not any(processes_with(n) for n in names), 10), names
    size = tick.stat().st_size
    time.sleep(0.6)
    assert tick.stat().st_size == size, "the daemon outlived the sandbox"
    assert [n for w in workers for n in _state_dirs(w)] == []
