"""M15: each live sandbox has its own host uid, so per-user kernel quotas are its own.

The ranges used here stay clear of 64000, the id unmodified corral builds
on this host use for every sandbox.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .conftest import corral_argv, processes_with, wait_for

pytestmark = [pytest.mark.requires_sandbox]

_INOTIFY = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
want, marker = int(sys.argv[1]), sys.argv[2]
fds = []
while len(fds) < want:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print('inotify', len(fds), flush=True)
sys.stdin.read()
"""


def _max_user_instances() -> int:
    return int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())


def _env(uid_range: str) -> dict[str, str]:
    return {**os.environ, "CORRAL_UID_RANGE": uid_range}


@contextmanager
def _holder(
    workspace: Path, marker: str, uid_range: str, instances: int
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A sandbox that holds `instances` inotify instances until its stdin closes."""
    argv = corral_argv(
        "--workspace", str(workspace), "--", "python3", "-I", "-S", "-c", _INOTIFY,
        str(instances), marker,
    )  # fmt: skip
    with subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(uid_range),
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            line = proc.stdout.readline().decode()
            if not line.startswith("inotify "):
                proc.kill()
                _, err = proc.communicate(timeout=30)
                pytest.fail(f"holder did not start: {line!r} {err.decode()!r}")
            yield proc, int(line.split()[1])
        finally:
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait(30)


def _host_uids(marker: str) -> set[int]:
    """Host uids of the sandbox's processes (corral itself, uid 0, is left out)."""
    uids: set[int] = set()
    for pid in processes_with(marker):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:"):
                uids.update(int(v) for v in line.split()[1:])
    return uids - {0}


def test_a_sandbox_exhausting_inotify_does_not_starve_another(
    workspace: Path, tmp_path: Path
) -> None:
    limit = _max_user_instances()
    ws_b = tmp_path / "ws-b"
    ws_b.mkdir()
    with (
        _holder(workspace, "corral-hog-a", "64800-64809", limit) as (_, held),
        _holder(ws_b, "corral-hog-b", "64800-64809", 5) as (_, got),
    ):
        uids_a, uids_b = _host_uids("corral-hog-a"), _host_uids("corral-hog-b")
    assert held > 0
    assert got == 5, f"the second sandbox got {got}/5 inotify instances"
    assert len(uids_a) == 1 and len(uids_b) == 1, (uids_a, uids_b)
    assert uids_a != uids_b
    assert uids_a | uids_b <= set(range(64800, 64810))


def test_exhausted_range_refuses_with_125(workspace: Path, tmp_path: Path) -> None:
    with _holder(workspace, "corral-only-uid", "64810-64810", 1):
        proc = subprocess.run(
            corral_argv("--workspace", str(tmp_path), "--", "true"),
            capture_output=True,
            text=True,
            timeout=60,
            env=_env("64810-64810"),
            check=False,
        )
    assert proc.returncode == 125, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no free sandbox uid in 64810-64810" in lines[0], lines


def _run_one(workspace: Path, uid_range: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        corral_argv(
            "--workspace", str(workspace), "--", "sh", "-c", "grep ^Uid: /proc/self/status"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(uid_range),
        check=False,
    )


def test_uid_is_reclaimed_after_teardown(workspace: Path) -> None:
    for _ in range(2):
        proc = _run_one(workspace, "64811-64811")
        assert proc.returncode == 0, proc.stderr
    with _holder(workspace, "corral-reuse", "64811-64811", 1):
        assert _host_uids("corral-reuse") == {64811}


def test_uid_is_reclaimed_after_corral_is_sigkilled(workspace: Path) -> None:
    marker = "corral-killed-holder"
    with _holder(workspace, marker, "64812-64812", 1) as (proc, _):
        assert _host_uids(marker) == {64812}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    # The dead launcher's sandbox dies with it (--die-with-parent); until
    # its last process is gone the uid is not handed out again.
    assert wait_for(lambda: processes_with(marker) == [], timeout=30)
    after = _run_one(workspace, "64812-64812")
    assert after.returncode == 0, after.stderr


def _sandbox_pids(marker: str) -> list[int]:
    return [p for p in processes_with(marker) if _host_uids_of(p) - {0}]


def _host_uids_of(pid: int) -> set[int]:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    line = next(ln for ln in status.splitlines() if ln.startswith("Uid:"))
    return {int(v) for v in line.split()[1:]}


def test_a_sandbox_cannot_signal_another(workspace: Path, tmp_path: Path) -> None:
    attack = (
        "import os, signal, sys\n"
        "for pid in map(int, sys.argv[1:]):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "        print(pid, 'killed')\n"
        "    except OSError as e:\n"
        "        print(pid, e.errno)\n"
    )
    with _holder(workspace, "corral-sig-victim", "64820-64829", 1):
        victims = _sandbox_pids("corral-sig-victim")
        assert victims
        proc = subprocess.run(
            corral_argv("--workspace", str(tmp_path), "--", "python3", "-I", "-S", "-c", attack)
            + [str(p) for p in victims],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env("64820-64829"),
            check=False,
        )
        alive = _sandbox_pids("corral-sig-victim")
        # Control: the same program outside any sandbox does kill them.
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", attack, *map(str, victims)], check=True, timeout=60
        )
        assert wait_for(lambda: not set(victims) & set(_sandbox_pids("corral-sig-victim")))
    assert proc.returncode == 0, proc.stderr
    assert sorted(alive) == sorted(victims), proc.stdout


def test_a_uid_with_a_lingering_process_is_not_reused(workspace: Path) -> None:
    # What a crashed launcher leaves: its lock released, its lock file still
    # "in-use", and a process of its sandbox not dead yet.
    uid = 64814
    Path(f"/run/corral/uids/{uid}.lock").parent.mkdir(parents=True, exist_ok=True)
    Path(f"/run/corral/uids/{uid}.lock").write_bytes(b"in-use\n")
    lingering = subprocess.Popen(
        ["/bin/sleep", "120"],
        user=uid,
        group=uid,
        extra_groups=[],
    )
    try:
        refused = _run_one(workspace, f"{uid}-{uid}")
    finally:
        lingering.kill()
        lingering.wait()
    assert refused.returncode == 125, refused.stdout
    assert "still have processes (1)" in refused.stderr
    after = _run_one(workspace, f"{uid}-{uid}")
    assert after.returncode == 0, after.stderr
