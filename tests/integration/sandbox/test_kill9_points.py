"""kill -9 of `corral exec` at any point leaves no process, mount or cgroup behind.

The kill points come from a counter, not a clock: strace's fault injection
delivers SIGKILL to corral on its N-th system call, for N spread over the
part of a run that follows the imports (cgroup creation, bwrap's start, the
wait, the teardown). The command leaves a setsid'd daemon, so a missed
teardown shows as a live process. The host then checks:

- no process carrying the run's marker exists (bwrap's --die-with-parent and
  the pid namespace's end take them, without corral's help);
- no mount in the host's mount table names the workspace;
- the dead corral's cgroups hold no process, and the next `corral exec`
  removes them (a SIGKILLed process cannot remove its own: the sweep of
  cgroups whose owner is gone does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import corral_argv, processes_with, wait_for

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_strace]

#: Where, as a fraction of the system calls after the first cgroup access, corral is killed.
_POINTS = (0.0, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.97)


def _command(marker: str) -> list[str]:
    # `sh -c CMD NAME` puts NAME in the daemon's command line (its $0).
    return [
        "sh",
        "-c",
        f'setsid sh -c "sleep 1000" {marker}-daemon & exec sh -c "sleep 0.3" {marker}-main',
    ]


def _cgroup_roots() -> list[str]:
    from corral.sandbox.cgroup import detect_layout

    layout = detect_layout()
    assert layout is not None
    roots = [os.path.join(path, "corral") for _, path in layout.v1]
    if layout.unified is not None:
        roots.append(os.path.join(layout.unified, "corral"))
    return [r for r in roots if os.path.isdir(r)]


def _cgroups_of(pid: int) -> list[str]:
    out = []
    for root in _cgroup_roots():
        out += [
            os.path.join(root, n) for n in os.listdir(root) if n.split("-")[1:2] == [str(pid)]
        ]
    return out


def _procs_in(cgroups: list[str]) -> int:
    n = 0
    for cg in cgroups:
        try:
            n += len(Path(cg, "cgroup.procs").read_text().split())
        except OSError:
            continue  # removed meanwhile
    return n


def _mounts_naming(path: str) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if path in line]


def _strace(workspace: Path, marker: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    strace = shutil.which("strace")
    assert strace is not None
    argv = corral_argv("--workspace", str(workspace), "--", *_command(marker))
    return subprocess.run(
        [strace, "-qq", *extra, "--", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def syscall_span(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int]:
    """(first cgroup syscall, total) of one complete traced run: the range to kill in."""
    ws = tmp_path_factory.mktemp("span") / "ws"
    ws.mkdir(mode=0o700)
    log = ws.parent / "trace.txt"
    proc = _strace(ws, "corral-span", "-o", str(log))
    assert proc.returncode == 0, proc.stderr.decode()[-500:]
    lines = log.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if "/sys/fs/cgroup" in line)
    return first + 1, len(lines)


@pytest.mark.parametrize("point", _POINTS)
def test_kill9_at_syscall_leaves_nothing(
    point: float, syscall_span: tuple[int, int], workspace: Path, marker: str
) -> None:
    first, total = syscall_span
    n = first + int((total - first) * point)
    strace = shutil.which("strace")
    assert strace is not None
    argv = corral_argv("--workspace", str(workspace), "--", *_command(marker))
    # Without -f only corral's main thread is traced and counted.
    with subprocess.Popen(
        [strace, "-qq", "-o", "/dev/null", "-e", f"inject=all:signal=KILL:when={n}", "--", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        corral_pid = _child_of(proc.pid)
        proc.wait(60)
    if corral_pid is None:
        pytest.fail("could not see corral's pid under strace")
    assert wait_for(lambda: processes_with(marker) == [], timeout=15), processes_with(marker)
    assert _mounts_naming(str(workspace)) == []
    left = _cgroups_of(corral_pid)
    assert wait_for(lambda: _procs_in(left) == 0, timeout=10), left
    # The next corral sweeps the dead one's cgroups.
    done = subprocess.run(
        corral_argv("--workspace", str(workspace), "--", "true"),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-500:]
    assert _cgroups_of(corral_pid) == []


def _child_of(pid: int) -> int | None:
    """The pid strace started (its only child), read before it can exit."""

    def found() -> bool:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return True
        return bool(kids)

    wait_for(found, timeout=10)
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None
