"""A run's directory on its own ext4 image: a hard disk quota for everything of a run.

The image is a sparse file of exactly `run_disk` bytes in `<runs>/.disks/`,
formatted ext4 and loop-mounted on the run directory, so the workspace,
snapshots, logs, transcripts and journal of a run share one filesystem that
cannot grow: a filling sandbox gets ENOSPC there, and the host filesystem
pays at most the image's size. The kernel frees the loop device when the
mount goes (util-linux sets LO_FLAGS_AUTOCLEAR for `mount -o loop`).

Whoever mounts writes `<rid>.owner` (its pid) next to the image first; a
mount whose owner is gone (coordinator killed with SIGKILL) is unmounted by
`sweep_stale` on the next start, as stale cgroups are.

A part of the image is ext4's reserved blocks, kept for corral's own state
(journal, state db, report). ext4 lets a write use them when the writer runs
as `s_resuid`, is in group `s_resgid` (unless that is 0), or holds
CAP_SYS_RESOURCE (which root lacks on some hosts, this one included). The
image's reserve belongs to `RESERVE_GID`, which the coordinator adds to its
supplementary groups (`join_reserve_group`) and its brokers inherit; a
sandbox drops all groups and runs as a leased uid, and host git runs with
the group and the capability dropped (`hostgit`), as it writes objects of
the agent's data. So a disk-filling agent gets ENOSPC while corral can still
record how the run ended.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from corral.errors import RunDiskError
from corral.sandbox.cgroup import pid_alive

__all__ = [
    "DISKS_DIR",
    "RESERVE_GID",
    "RESERVE_UID",
    "RunDisk",
    "create_run_disk",
    "ensure_mounted",
    "is_mounted",
    "join_reserve_group",
    "reserve_bytes",
    "sweep_stale",
]

DISKS_DIR = ".disks"
#: ext4 with a 4 KiB block size needs a few MiB for its own metadata.
MIN_BYTES = 16 << 20
_TOOL_TIMEOUT_S = 60.0
#: Owner and group of the reserved blocks (ext4 keeps 16 bits of each).
#: `nobody`/`nogroup`: outside the sandbox uid range (`uids.range_conflict`
#: keeps it off /etc/passwd) and nothing of corral runs as them; only the
#: group grants the reserve to corral, and only inside the 0700 run directory.
RESERVE_UID = 65534
RESERVE_GID = 65534
_BLOCK = 4096


def reserve_bytes(size_bytes: int) -> int:
    """The part of a `run_disk` image kept for corral's state: an eighth, 4 to 64 MiB."""
    return max(4 << 20, min(64 << 20, size_bytes // 8))


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str | None = None) -> list[str]:
    """Every mount point of this mount namespace (from /proc/self/mountinfo)."""
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            mountinfo = fh.read()
    return [_unescape(line.split()[4]) for line in mountinfo.splitlines() if len(line.split()) > 4]


def is_mounted(path: Path) -> bool:
    return str(path.absolute()) in mount_points()


def _run(argv: list[str], what: str) -> None:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RunDiskError(errno.EIO, f"{what}: {exc}") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]
        raise RunDiskError(errno.EIO, f"{what}: {last}")


class RunDisk:
    """The image of run `rid` under `runs_dir`, mounted on `runs_dir/rid`."""

    def __init__(self, runs_dir: Path, rid: str) -> None:
        self.runs_dir = runs_dir.absolute()
        self.rid = rid
        self.image = self.runs_dir / DISKS_DIR / f"{rid}.img"
        self.owner = self.runs_dir / DISKS_DIR / f"{rid}.owner"
        self.target = self.runs_dir / rid

    def create(self, size_bytes: int) -> None:
        """A sparse image of `size_bytes`, formatted ext4 (refuses an existing image)."""
        if size_bytes < MIN_BYTES:
            raise RunDiskError(errno.EINVAL, f"run_disk must be at least {MIN_BYTES >> 20} MiB")
        self.image.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(self.image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise RunDiskError(exc.errno, f"cannot create {self.image}: {exc.strerror}") from exc
        try:
            os.ftruncate(fd, size_bytes)
        finally:
            os.close(fd)
        # -b 4096: the reserve below is counted in these blocks;
        # nodiscard: the sparse file is already all holes.
        _run(
            [
                "mkfs.ext4",
                "-q",
                "-F",
                "-b",
                str(_BLOCK),
                "-E",
                "nodiscard",
                "-L",
                "corral-run",
                str(self.image),
            ],
            "mkfs.ext4",
        )
        _run(
            [
                "tune2fs",
                "-r",
                str(reserve_bytes(size_bytes) // _BLOCK),
                "-u",
                str(RESERVE_UID),
                "-g",
                str(RESERVE_GID),
                str(self.image),
            ],
            "tune2fs",
        )

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialise mount decisions on this image between processes (status, resume, sweep)."""
        self.image.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(
            self.runs_dir / DISKS_DIR / f"{self.rid}.lock",
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
            0o600,
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def mount(self) -> None:
        """Mount the image on the run directory (created 0700 if missing)."""
        with self.locked():
            self._mount()

    def _mount(self) -> None:
        if is_mounted(self.target):
            raise RunDiskError(errno.EBUSY, f"{self.target} is already mounted")
        self.target.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Durable before acknowledged: the owner is on disk before the mount
        # exists, so a SIGKILL between the two leaves something to sweep.
        self._write_owner()
        _run(
            ["mount", "-t", "ext4", "-o", "loop,nosuid,nodev", str(self.image), str(self.target)],
            f"mount {self.image}",
        )
        os.chmod(self.target, 0o700)

    def _write_owner(self) -> None:
        tmp = self.owner.with_suffix(".owner.tmp")
        tmp.write_text(f"{os.getpid()}\n", encoding="ascii")
        os.replace(tmp, self.owner)

    def unmount(self) -> None:
        """Unmount (the loop device goes with it); a no-op when not mounted.

        A mount still in use (a leftover process with its cwd inside) is
        detached lazily: gone from the mount table now, the loop device freed
        by the kernel when the last user lets go.
        """
        with self.locked():
            self._unmount()

    def _unmount(self) -> None:
        if is_mounted(self.target):
            try:
                _run(["umount", str(self.target)], f"umount {self.target}")
            except RunDiskError:
                _run(["umount", "-l", str(self.target)], f"umount -l {self.target}")
        with contextlib.suppress(FileNotFoundError):
            self.owner.unlink()

    def remove(self) -> None:
        """Unmount and delete the image (the run's data with it)."""
        self.unmount()
        for leftover in (self.image, self.runs_dir / DISKS_DIR / f"{self.rid}.lock"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _owner_pid(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def join_reserve_group() -> None:
    """Let this process (and what it starts later) write into an image's reserve.

    Idempotent. Only processes that write corral's state should call it; it
    is set before any broker is started, which inherits the group.
    """
    groups = os.getgroups()
    if RESERVE_GID in groups:
        return
    try:
        os.setgroups([*groups, RESERVE_GID])
    except OSError as exc:
        raise RunDiskError(
            exc.errno, f"cannot join group {RESERVE_GID} for the state reserve: {exc.strerror}"
        ) from exc


def create_run_disk(runs_dir: Path, rid: str, size_bytes: int) -> RunDisk:
    """A new run's image, mounted on its (empty) directory before anything is written."""
    join_reserve_group()
    disk = RunDisk(runs_dir, rid)
    disk.create(size_bytes)
    disk.mount()
    return disk


def ensure_mounted(run_root: Path) -> None:
    """Mount the image of the run at `run_root` if it has one (`corral resume`, `status`).

    A run directory without an image is left alone; one already mounted by a
    process that is gone is adopted, so the next sweep leaves it in place.
    """
    root = run_root.absolute()
    disk = RunDisk(root.parent, root.name)
    if not disk.image.is_file():
        return
    join_reserve_group()
    with disk.locked():
        if not is_mounted(disk.target):
            disk._mount()
            return
        pid = _owner_pid(disk.owner)
        if pid is None or not pid_alive(pid):
            disk._write_owner()


def sweep_stale(runs_dir: Path) -> list[str]:
    """Unmount run images whose owner process is gone; returns the run ids swept."""
    disks = runs_dir.absolute() / DISKS_DIR
    swept: list[str] = []
    if not disks.is_dir():
        return swept
    for owner in sorted(disks.glob("*.owner")):
        pid = _owner_pid(owner)
        if pid is not None and pid != os.getpid() and pid_alive(pid):
            continue
        disk = RunDisk(runs_dir, owner.name.removesuffix(".owner"))
        with disk.locked():
            # Re-read under the lock: a `corral status` may have adopted it.
            pid = _owner_pid(owner)
            if pid is not None and pid != os.getpid() and pid_alive(pid):
                continue
            disk._unmount()
        swept.append(disk.rid)
    return swept
