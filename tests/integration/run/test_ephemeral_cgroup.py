"""A `corral view` / `corral agent run` killed with SIGKILL cannot remove its own
run cgroup (`corral/run-<kind>-<pid>-<hex>`) nor stop what runs in it; the next
one of the same kind sweeps it: processes killed, cgroups removed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from corral.run.runcg import RunCgroup, ephemeral_run_cgroup

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup]


def test_a_dead_owners_cgroup_and_its_processes_are_swept_by_the_next_owner() -> None:
    # The "owner" is a child that creates its cgroup, leaves a process in a
    # helper group below it, and dies without cleaning up (as after SIGKILL).
    owner = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, subprocess\n"
            "from corral.run.runcg import ephemeral_run_cgroup\n"
            "cg = ephemeral_run_cgroup('view')\n"
            "cg.create(64 << 20)\n"
            "p = subprocess.Popen(['sleep', '300'], start_new_session=True,\n"
            "    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "for procs in cg.helper_procs('forward'):\n"
            "    open(procs, 'w').write(str(p.pid))\n"
            "print(cg.run_id, p.pid, flush=True)\n"
            "os._exit(0)\n",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    rid, pid_s = owner.stdout.split()
    leftover = int(pid_s)
    try:
        assert os.path.exists(f"/proc/{leftover}")
        mine = ephemeral_run_cgroup("view")
        assert mine is not None and mine.run_id != rid
        # Reparented to init, which reaps it once the sweep's SIGKILL lands.
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{leftover}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{leftover}"), "the dead owner's process still runs"
        assert not RunCgroup(mine.layout, rid).exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leftover, signal.SIGKILL)
