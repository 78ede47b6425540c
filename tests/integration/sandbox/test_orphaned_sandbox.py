"""A sandbox whose host is gone ends itself (both inits), without the host's cgroup kill.

bwrap's pid 1 arms `--die-with-parent` only after its own setup, and reaps for
as long as one process of its namespace lives. A `corral exec` killed (-9) in
that window took bwrap's monitor with it (PDEATHSIG) but left pid 1 and a
setsid'd daemon running with nobody to end them, until the next corral start
swept the cgroup (`test_kill9_points.py` hit it at one kill point). What the
init sees of that death is the host's end of `--hold` closing before the
command ended: here the host closes it by hand, as a dead corral's kernel
would, and then does nothing; the daemon must be gone all the same. On the
previous init (both kinds) the marked processes live on. (The init's kill after
the normal release has no test of its own: with bwrap's monitor alive, its
exit takes pid 1 and the daemon anyway.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pytest

from corral.exec.cli import sandbox_env
from corral.sandbox.namespace import NamespaceSandbox, RunningSandbox
from corral.sandbox.spec import SandboxSpec

from .conftest import processes_with, wait_for

pytestmark = [pytest.mark.requires_sandbox]

KINDS: list[Literal["c", "python"]] = ["c", "python"]


def _start(ws: Path, kind: Literal["c", "python"], script: str) -> RunningSandbox:
    spec = SandboxSpec(
        argv=("sh", "-c", script),
        workspace=str(ws),
        env=tuple(sorted(sandbox_env("/home/corral", {}).items())),
    )
    return NamespaceSandbox(spec, init_kind=kind).start()


def _event(running: RunningSandbox, name: str) -> bool:
    running._drain_status()
    return any(e.get("event") == name for e in running.events)


def _host_gone(running: RunningSandbox) -> None:
    """What a dead corral leaves the init: EOF on --hold, and no one acting on the sandbox."""
    os.close(running._hold_fd)
    running._hold_fd = -1


@pytest.mark.parametrize("kind", KINDS)
def test_host_gone_while_the_command_runs(
    kind: Literal["c", "python"], workspace: Path, marker: str
) -> None:
    running = _start(
        workspace,
        kind,
        f'setsid sh -c "sleep 1000" {marker}-daemon & exec sh -c "sleep 1000" {marker}-main',
    )
    try:
        assert wait_for(lambda: len(processes_with(marker)) >= 2, 20), "the command never ran"
        assert wait_for(lambda: _event(running, "started"), 20), running.events
        _host_gone(running)
        assert wait_for(lambda: processes_with(marker) == [], 15), processes_with(marker)
        # bwrap's pid 1 went with its last child: the monitor reports the end.
        assert wait_for(lambda: running.proc.poll() is not None, 15)
    finally:
        running.kill_all()
        running.close()
