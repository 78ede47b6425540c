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
from corral.run.footprint import run_disk_usage
from corral.run.rundisk import RunDisk, is_mounted, sweep_stale

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
