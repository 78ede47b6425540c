"""issue 10: a run directory on its own ext4 image is a hard disk quota.

Judged on the host: statvfs of the filesystem that holds the image, the
host mount table, and the loop devices.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import RunDiskError
from corral.hostgit import _NO_RESERVE
from corral.run.footprint import run_disk_usage
from corral.run.rundisk import RunDisk, is_mounted, reserve_bytes, sweep_stale

pytestmark = [pytest.mark.requires_root]

MIB = 1 << 20
QUOTA = 32 * MIB


@pytest.fixture
def host_fs(tmp_path: Path) -> Iterator[Path]:
    """A filesystem of our own standing in for the host's: statvfs then sees
    only this test's writes, not those of whatever else the host runs."""
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=768m,mode=0700", "tmpfs", str(fs)], check=True
    )
    try:
        yield fs
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _loops_backing(image: Path) -> str:
    out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def test_filling_the_run_dir_hits_enospc_and_the_host_pays_at_most_the_quota(
    host_fs: Path,
) -> None:
    disk = RunDisk(host_fs, "r1")
    disk.create(QUOTA)
    try:
        disk.mount()
        assert is_mounted(disk.target)
        before = _free(host_fs)
        written = 0
        with pytest.raises(OSError) as info, open(disk.target / "fill", "wb") as fh:
            for _ in range(4 * QUOTA // MIB):
                fh.write(b"\1" * MIB)
                fh.flush()
                os.fsync(fh.fileno())
                written += MIB
        assert info.value.errno == errno.ENOSPC
        assert written < QUOTA
        assert before - _free(host_fs) <= QUOTA
        # `corral status`'s footprint reads the same quota from the run's image.
        used, cap = run_disk_usage(disk.target)
        assert cap is not None and used is not None
        assert cap <= QUOTA and used >= written // 2
    finally:
        disk.remove()
    assert not is_mounted(disk.target)
    assert _loops_backing(disk.image) == ""


#: The coordinator: joins the reserve group, then writes its state (argv:
#: path) or starts host git's way (argv: path, then a command it execs).
CORAL_SIDE = """
import os, sys
from corral.run.rundisk import join_reserve_group
join_reserve_group()
if len(sys.argv) > 2:
    os.execvp(sys.argv[2], sys.argv[2:])
with open(sys.argv[1], "wb") as fh:
    fh.write(b"s" * (1 << 20))
"""


def _write_mib(argv_prefix: list[str], path: Path, mib: int) -> subprocess.CompletedProcess[str]:
    """`mib` MiB written by `argv_prefix dd` to `path`, opened here (ext4
    judges the reserve by the writer's credentials at each write)."""
    with open(path, "wb") as out:
        return subprocess.run(
            [*argv_prefix, "dd", "if=/dev/urandom", "bs=1M", f"count={mib}", "iflag=fullblock"],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=60,
        )


def test_an_agent_filling_the_image_leaves_corrals_reserve_and_git_cannot_take_it(
    tmp_path: Path,
) -> None:
    disk = RunDisk(tmp_path, "rr")
    disk.create(QUOTA)
    try:
        disk.mount()
        agent = ["setpriv", "--reuid=64999", "--regid=64999", "--clear-groups", "--"]
        filled = _write_mib(agent, disk.target / "fill", 2 * QUOTA // MIB)
        assert "No space left" in filled.stderr
        size = (disk.target / "fill").stat().st_size
        assert size <= QUOTA - reserve_bytes(QUOTA)
        # Host git's writes (root, groups and CAP_SYS_RESOURCE dropped) and a
        # snapshot (unprivileged free space, checked) get no reserve either.
        git_like = _write_mib(
            [sys.executable, "-c", CORAL_SIDE, "-", *_NO_RESERVE], disk.target / "obj", 2
        )
        assert "No space left" in git_like.stderr
        assert (disk.target / "obj").stat().st_size < MIB
        # corral's state writer (the coordinator, its brokers) still can.
        state = subprocess.run(
            [sys.executable, "-c", CORAL_SIDE, str(disk.target / "state")],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert state.returncode == 0, state.stderr
        assert (disk.target / "state").stat().st_size == MIB
    finally:
        disk.remove()


HOLDER = """
import sys, time
from pathlib import Path
from corral.run.rundisk import RunDisk
d = RunDisk(Path(sys.argv[1]), "r2")
d.create(32 << 20)
d.mount()
print("mounted", flush=True)
time.sleep(60)
"""


def test_kill_9_of_the_owner_leaves_nothing_mounted_after_the_sweep(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    disk = RunDisk(tmp_path, "r2")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "mounted"
        assert is_mounted(disk.target)
        assert sweep_stale(tmp_path) == []  # its owner is alive: not stale
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert is_mounted(disk.target)  # the kernel keeps it; the sweep must act
        assert sweep_stale(tmp_path) == ["r2"]
        assert not is_mounted(disk.target)
        deadline = time.monotonic() + 5
        while _loops_backing(disk.image) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _loops_backing(disk.image) == ""
        disk.mount()  # `corral resume`: the same image, the data still there
        assert is_mounted(disk.target)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        disk.remove()


def test_a_too_small_quota_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunDiskError, match="at least"):
        RunDisk(tmp_path, "r3").create(1 * MIB)
