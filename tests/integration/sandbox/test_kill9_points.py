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
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import corral_argv, processes_with, wait_for

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_strace]

#: Where, as a fraction of the system calls after the first cgroup access, corral is
#: killed; each moves on to the next milestone call. On this tree's code they land on:
#: the cgroup's mkdir, the uid lease, the workspace placeholders, the fork of bwrap,
#: the supervisor threads (the sandbox running), the pidfd it waits on, the cgroup's
#: rmdir and the placeholders' removal (teardown).
_POINTS = (0.18, 0.26, 0.40, 0.50, 0.55, 0.575, 0.85, 0.90)


#: Calls corral makes a fixed number of times per run, marking its steps (cgroup and
#: placeholder directories, pipes, the userns helper's and bwrap's fork, the pidfd
#: it waits on, unlinks and removals at teardown). Calls whose count depends on
#: timing or on the sandbox (futex, kill, wait4, read, select) cannot name a point.
_MILESTONES = frozenset(
    {"mkdir", "mkdirat", "rmdir", "clone", "clone3", "pidfd_open", "pipe2", "unlink", "unlinkat",
     "memfd_create", "open_tree", "mount_setattr", "socketpair", "rename", "renameat2"}
)  # fmt: skip
_SYSCALL = re.compile(r"^([a-z_0-9]+)\(")


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
        out += [os.path.join(root, n) for n in os.listdir(root) if n.split("-")[1:2] == [str(pid)]]
    return out


def _procs_in(cgroups: list[str]) -> int:
    n = 0
    for cg in cgroups:
        try:
            n += len(Path(cg, "cgroup.procs").read_text().split())
        except OSError:
            continue  # removed meanwhile
    return n


def _describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
            cg = Path(f"/proc/{pid}/cgroup").read_text().replace("\n", " ")[:300]
        except OSError:
            continue
        keep = [line for line in status if line.split(":")[0] in ("Name", "State", "PPid", "NSpid")]
        out.append(f"{pid}: {' '.join(keep)} cmd={cmd!r} cgroup={cg}")
    return out


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
def syscall_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], int]:
    """Corral's system calls (names, in order) in one traced run, and where its
    first cgroup access is: the span after the imports, where kills matter."""
    ws = tmp_path_factory.mktemp("span") / "ws"
    ws.mkdir(mode=0o700)
    log = ws.parent / "trace.txt"
    proc = _strace(ws, "corral-span", "-o", str(log))
    assert proc.returncode == 0, proc.stderr.decode()[-500:]
    calls = [line for line in log.read_text().splitlines() if _SYSCALL.match(line)]
    first = next(i for i, line in enumerate(calls) if "/sys/fs/cgroup" in line)
    return [_name(line) for line in calls], first


def _name(line: str) -> str:
    m = _SYSCALL.match(line)
    assert m is not None
    return m.group(1)


def _kill_point(log: tuple[list[str], int], point: float) -> tuple[str, int]:
    """(syscall, how many of it corral has made including this one) at `point` of the span.

    strace's `when=N` counts each system call separately, so a point is
    named by one call and its ordinal. Most calls' counts vary from run to
    run, so the point moves on to the next milestone call (the last one when
    none follows), whose ordinal names the same step in every run.
    """
    names, first = log
    start = min(len(names) - 1, first + int((len(names) - first) * point))
    after = [j for j in range(start, len(names)) if names[j] in _MILESTONES]
    before = [j for j in range(start, first - 1, -1) if names[j] in _MILESTONES]
    i = (after or before)[0]
    return names[i], names[: i + 1].count(names[i])


@pytest.mark.parametrize("point", _POINTS)
def test_kill9_at_syscall_leaves_nothing(
    point: float, syscall_log: tuple[list[str], int], workspace: Path, marker: str
) -> None:
    name, nth = _kill_point(syscall_log, point)
    strace = shutil.which("strace")
    assert strace is not None
    argv = corral_argv("--workspace", str(workspace), "--", *_command(marker))
    # Without -f only corral's main thread is traced and counted.
    inject = f"inject={name}:signal=KILL:when={nth}"
    with subprocess.Popen(
        [strace, "-qq", "-o", "/dev/null", "-e", f"trace={name}", "-e", inject, "--", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        corral_pid = _child_of(proc.pid)
        rc = proc.wait(60)
    # strace re-raises the tracee's fatal signal on itself.
    assert rc == -signal.SIGKILL, f"corral was not killed at {name} #{nth} (rc {rc})"
    assert corral_pid is not None, "could not see corral's pid under strace"
    assert wait_for(lambda: processes_with(marker) == [], timeout=15), _describe(
        processes_with(marker)
    )
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
