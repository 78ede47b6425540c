"""The sweep at every start removes the cgroups of a corral that no longer exists.

A SIGKILLed corral cannot remove its sandbox's cgroups; the next start finds
them by the owner pid in their name and kills what is still inside. The
sweep tells cgroups from the control files beside them by directory entry
type (no stat per entry), so this checks it still finds them, in every
hierarchy.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from corral.sandbox.cgroup import Cgroup, detect_layout, sweep_stale
from corral.sandbox.spec import Limits

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_cgroup_with_a_process_is_killed_and_removed() -> None:
    layout = detect_layout()
    assert layout is not None
    parent = f"corral-test-sweep-{os.getpid()}"
    dead = _dead_pid()
    stale = Cgroup.create(layout, f"{parent}/exec-{dead}-{os.urandom(4).hex()}", Limits())
    live = Cgroup.create(layout, f"{parent}/exec-{os.getpid()}-{os.urandom(4).hex()}", Limits())
    inside = subprocess.Popen(["sleep", "60"])
    try:
        stale.attach_pid(inside.pid)
        assert sweep_stale(layout, parent) == [stale.relpath]
        assert inside.wait(10) == -9
        assert not any(os.path.isdir(d) for d in stale.dirs.values())
        # The live owner's cgroup (this process) is left alone.
        assert all(os.path.isdir(d) for d in live.dirs.values())
    finally:
        inside.kill()
        inside.wait()
        stale.remove()
        live.remove()
        for d in {os.path.dirname(d) for d in live.dirs.values()}:
            os.rmdir(d)
