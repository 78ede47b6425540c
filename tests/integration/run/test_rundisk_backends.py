"""issue 10: the state reserve of a run's disk image holds against every backend.

The coordinator holds the reserve's group (`join_reserve_group`) and every
sandbox it starts inherits its credentials unless the backend drops them; on
gVisor the files are written by runsc's gofer, on the microVM by QEMU, both
host processes corral starts. An agent filling the workspace from any backend
must stop where the reserve begins; the control (the coordinator's own writer,
which may use the reserve) shows the image lets a reserve-holder past it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.run.rundisk import RunDisk, reserve_bytes

pytestmark = [pytest.mark.requires_root, pytest.mark.timeout(300)]

MIB = 1 << 20
QUOTA = 48 * MIB

#: As the coordinator: join the reserve group, then exec the rest of argv.
AS_COORDINATOR = (
    "import os, sys\n"
    "from corral.run.rundisk import join_reserve_group\n"
    "join_reserve_group()\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)

_BACKENDS = [
    pytest.param(["--backend", "namespace"], marks=pytest.mark.requires_sandbox, id="namespace"),
    pytest.param(["--backend", "gvisor"], marks=pytest.mark.requires_runsc, id="gvisor"),
    pytest.param(
        ["--backend", "microvm", "--allow-degraded", "kvm"],
        marks=pytest.mark.requires_qemu,
        id="microvm",
    ),
]


@pytest.mark.parametrize("backend", _BACKENDS)
def test_an_agent_on_any_backend_cannot_take_the_reserve(
    tmp_path: Path, backend: list[str]
) -> None:
    disk = RunDisk(tmp_path, "rb")
    disk.create(QUOTA)
    try:
        disk.mount()
        ws = disk.target / "ws"
        ws.mkdir()
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                AS_COORDINATOR,
                sys.executable,
                "-m",
                "corral",
                "exec",
                *backend,
                "--workspace",
                str(ws),
                "--",
                "sh",
                "-c",
                f"dd if=/dev/zero of=fill bs=1M count={2 * QUOTA // MIB}; sync",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=280,
        )
        assert "No space left" in out.stderr, out.stderr[-2000:]
        size = (ws / "fill").stat().st_size
        st = os.statvfs(disk.target)
        assert size <= QUOTA - reserve_bytes(QUOTA), f"the agent wrote {size >> 20} MiB"
        # What remains free is at least the reserve (blocks, all users).
        assert st.f_bfree * st.f_frsize >= reserve_bytes(QUOTA) * 0.9
        # Control: the coordinator's own writer goes on into the reserve.
        with open(disk.target / "state", "wb") as fh:
            state = subprocess.run(
                [sys.executable, "-c", AS_COORDINATOR, "dd", "if=/dev/zero", "bs=1M", "count=2"],
                stdout=fh,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
                timeout=60,
            )
        assert state.returncode == 0, state.stderr
        assert (disk.target / "state").stat().st_size == 2 * MIB
    finally:
        disk.remove()
