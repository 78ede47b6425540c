"""The warm worker's parked sandbox child (`sandbox.prefork`): attacks on what it could weaken.

As root, a warm worker creates the next sandbox's cgroup and forks a child
into it ahead of the request. These tests kill -9 that child and its worker
while it is parked, edit the source under it, and check that the request's
limits and nothing else reach the sandbox it becomes; every assertion is on
the host (processes, cgroup directories and files, descriptors).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.exec import launcher
from corral.sandbox import prefork

from .conftest import corral_argv, processes_with, wait_for
from .test_kill9_points import _cgroups_of, _procs_in
from .test_launcher import Launcher, alive, children_of, comm, frontend, launcher_proc

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_root]

__all__ = ["frontend", "launcher_proc"]


@pytest.fixture
def parked(launcher_proc: Launcher) -> Iterator[tuple[int, int]]:
    """(warm worker, its parked child) once the child is in its cgroup."""

    def ready() -> bool:
        warm = launcher_proc.warm()
        return len(warm) == 1 and len(_spawned(warm[0])) == 1

    assert wait_for(ready, 30), children_of(launcher_proc.pid)
    (warm,) = launcher_proc.warm()
    (child,) = _spawned(warm)
    yield warm, child


def _spawned(warm: int) -> list[int]:
    return [p for p in children_of(warm) if comm(p) == prefork.SPAWN_COMM]


def _bwrap_of(warm: int, child: int) -> int:
    """The bwrap monitor the parked `child` became (its own exec)."""
    assert comm(child) == "bwrap", comm(child)
    return child


def _procs_of(cgroup_dir: str) -> list[int]:
    return [int(p) for p in Path(cgroup_dir, "cgroup.procs").read_text().split()]


def _in_cgroups(pid: int) -> set[str]:
    """The last component of every cgroup path `pid` is in (host side, /proc/PID/cgroup)."""
    names = set()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        names.add(line.rsplit("/", 1)[-1])
    return names


def _run(
    frontend: Path, launcher_proc: Launcher, cwd: Path, *args: str, require: bool = True
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(frontend), "exec", *args],
        cwd=cwd, env=launcher_proc.env(require=require), capture_output=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_the_parked_child_is_in_its_cgroup_before_the_request(
    parked: tuple[int, int],
) -> None:
    """Attached ahead (the first-attach wait is paid there), in a cgroup named for its worker."""
    warm, child = parked
    dirs = _cgroups_of(warm)
    assert dirs, "no cgroup prepared"
    assert all(str(child) in Path(d, "cgroup.procs").read_text().split() for d in dirs), dirs
    assert {os.path.basename(d) for d in dirs} <= _in_cgroups(child)


def test_kill9_of_the_warm_worker_takes_its_parked_child_and_cgroup(
    parked: tuple[int, int], workspace: Path
) -> None:
    """The child goes (EOF on its socketpair, PDEATHSIG); its cgroup, named for the dead
    worker, is swept by the next exec."""
    warm, child = parked
    dirs = _cgroups_of(warm)
    assert dirs
    os.kill(warm, signal.SIGKILL)
    assert wait_for(lambda: not alive(child), 10), f"parked child {child} outlived its worker"
    assert wait_for(lambda: _procs_in(dirs) == 0, 10), dirs
    subprocess.run(corral_argv("--workspace", str(workspace), "--", "true"), check=True)
    assert [d for d in dirs if os.path.isdir(d)] == []


def test_kill9_of_the_parked_child_leaves_nothing_and_the_request_is_served(
    parked: tuple[int, int], frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    """A dead parked child is discarded (its cgroup removed) and the normal path serves."""
    warm, child = parked
    dirs = _cgroups_of(warm)
    os.kill(child, signal.SIGKILL)
    assert wait_for(lambda: comm(child) in ("", "corral-spawn") and _procs_in(dirs) == 0, 10)
    proc = _run(frontend, launcher_proc, workspace, "--", "sh", "-c", "echo served")
    assert (proc.returncode, proc.stdout) == (0, b"served\n"), proc.stderr
    # Removed by the worker that served (a sweep skips its own pid's cgroups).
    assert [d for d in dirs if os.path.isdir(d)] == []
    assert not alive(child)


def test_the_requests_limits_are_in_the_prepared_cgroup(
    parked: tuple[int, int], frontend: Path, launcher_proc: Launcher, workspace: Path, marker: str
) -> None:
    """The cgroup was made with no limits; the request's are written before bwrap runs."""
    warm, child = parked
    (pids_dir,) = [d for d in _cgroups_of(warm) if "/pids/" in d]
    assert Path(pids_dir, "pids.max").read_text().strip() == "max"
    proc = subprocess.Popen(
        [str(frontend), "exec", "--pids", "37", "--", "sh", "-c", "echo started; sleep 60", marker],
        cwd=workspace, env=launcher_proc.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        # The prepared child started this sandbox's bwrap, in the prepared cgroup.
        assert _bwrap_of(warm, child) in _procs_of(pids_dir)
        assert Path(pids_dir, "pids.max").read_text().strip() == "37"
        sandboxed = [p for p in processes_with(marker) if p != proc.pid]
        assert sandboxed
        assert all(os.path.basename(pids_dir) in _in_cgroups(p) for p in sandboxed)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_the_sandbox_holds_nothing_of_the_workers_socketpair(
    parked: tuple[int, int], frontend: Path, launcher_proc: Launcher, workspace: Path, marker: str
) -> None:
    """The control socket is close-on-exec: bwrap (spawned by the parked child) has no socket."""
    warm, child = parked
    before = {os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")}
    socks = {link for link in before if link.startswith("socket:[")}
    assert len(socks) == 1, before
    proc = subprocess.Popen(
        [str(frontend), "exec", "--", "sh", "-c", "echo started; sleep 60", marker],
        cwd=workspace, env=launcher_proc.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        pids = [_bwrap_of(warm, child), *(p for p in processes_with(marker) if p != proc.pid)]
        for pid in pids:
            held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            assert not held & socks, (pid, held)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_an_edit_retires_the_parked_child_with_its_launcher(
    parked: tuple[int, int], frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    """Stale code never serves: the launcher exits on the edit, the parked child and cgroup go."""
    warm, child = parked
    dirs = _cgroups_of(warm)
    victim = Path(launcher.source_root()) / "corral" / "exec" / "__init__.py"
    st = victim.stat()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = _run(frontend, launcher_proc, workspace, "--", "sh", "-c", "echo fresh", require=False)
    assert (proc.returncode, proc.stdout) == (0, b"fresh\n"), proc.stderr
    launcher_proc.proc.wait(30)
    assert wait_for(lambda: not alive(child), 30), "a stale parked child outlived its launcher"
    assert wait_for(lambda: [d for d in dirs if os.path.isdir(d)] == [], 30), dirs


_HOLDER = """
import sys, time
from corral.sandbox import prefork
prefork.prepare(sys.argv[1])
(p,) = prefork._slot
print(p.pid, flush=True)
time.sleep(120)
"""


def test_kill9_of_any_worker_kills_its_parked_child_before_any_sweep(workspace: Path) -> None:
    """Under a cgroup parent of its own, which no other corral sweeps: the child goes by itself.

    (Under `corral/`, any corral on the host that starts meanwhile sweeps the dead worker's
    cgroup and kills the child too; here only the child's own EOF and PDEATHSIG can.)
    """
    from corral.sandbox.cgroup import detect_layout, sweep_stale

    layout = detect_layout()
    assert layout is not None
    parent = f"corral-t-{os.urandom(4).hex()}"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, parent],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        child = int(holder.stdout.readline())
        assert comm(child) == prefork.SPAWN_COMM
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert wait_for(lambda: not alive(child), 10), f"parked child {child} outlived its worker"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder.pid, signal.SIGKILL)
        # Not communicate(): a surviving child holds the pipe's write end.
        if holder.stdout is not None:
            holder.stdout.close()
        holder.wait()
        sweep_stale(layout, parent)
        for root in [m for _, m in layout.v1] + ([layout.unified] if layout.unified else []):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(os.path.join(root, parent))


def _ns_ino(pid: int, kind: str) -> int:
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def test_the_parked_child_holds_the_sandboxs_network_namespace_ahead(
    parked: tuple[int, int], frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    """The parked child made the next sandbox's network namespace (lo up) before
    the request; the command runs in exactly that one, and the no-egress resolver
    was attached to it before the command's first lookup."""
    warm, child = parked
    net = _ns_ino(child, "net")
    assert net != _ns_ino(os.getpid(), "net")
    assert net != _ns_ino(warm, "net")
    script = (
        "readlink /proc/self/ns/net; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ';"
        " getent hosts example.invalid; echo lookup=$?"
    )
    proc = _run(frontend, launcher_proc, workspace, "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == [f"net:[{net}]", "lo", "lookup=2"]
    # Answered (NXDOMAIN, counted) by the resolver, not refused: it was there first.
    assert b"name lookup(s) refused (example.invalid)" in proc.stderr


#: Every name protection guards at the top of a workspace, as the sandbox tries them.
_ATTACK = (
    "for f in .envrc .bashrc .profile .mcp.json .gitmodules; do"
    " (echo pwned > $f) 2>/dev/null && echo wrote $f; done;"
    " for d in .git .vscode .claude; do"
    " mkdir -p $d/hooks 2>/dev/null && echo made $d/hooks;"
    " rmdir $d 2>/dev/null && echo removed $d; done;"
    " grep -cE '/(\\.envrc|\\.git) ' /proc/self/mountinfo | sed 's/^/guards=/'"
)


def test_the_gated_child_guards_every_placeholder_it_was_gated_on(
    parked: tuple[int, int], frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    """The parked child stages while the worker makes the placeholders, and binds them
    only after (`launch(gate=...)`): every guarded name is read-only in the sandbox, and
    none of them is left in the workspace afterwards."""
    proc = _run(frontend, launcher_proc, workspace, "--", "sh", "-c", _ATTACK)
    assert proc.returncode == 0, proc.stderr
    # Nothing written, made or removed; both guards are mounts in the sandbox.
    assert proc.stdout.decode().split() == ["guards=2"], proc.stdout
    assert sorted(os.listdir(workspace)) == []


def test_a_placeholder_that_cannot_be_made_kills_the_gated_child(
    parked: tuple[int, int], frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    """The placeholders fail while the child waits at its gate (an immutable workspace:
    even root cannot create in it): the request fails closed and names why, and the
    child it had started staging is killed, its cgroup removed, nothing created."""
    warm, child = parked
    dirs = _cgroups_of(warm)
    subprocess.run(["chattr", "+i", str(workspace)], check=True)
    try:
        proc = _run(frontend, launcher_proc, workspace, "--", "sh", "-c", "echo ran")
    finally:
        subprocess.run(["chattr", "-i", str(workspace)], check=True)
    assert proc.returncode == 125, (proc.stdout, proc.stderr)
    assert b"ran" not in proc.stdout
    assert b"protect: cannot create placeholder" in proc.stderr, proc.stderr
    assert wait_for(lambda: not alive(child), 10), f"the gated child {child} outlived its request"
    assert [d for d in dirs if os.path.isdir(d)] == []
    assert os.listdir(workspace) == []


def test_the_parked_child_becomes_the_sandboxs_bwrap(workspace: Path) -> None:
    """In-process: the prepared child execs bwrap itself (its pid is bwrap's), and the
    sandbox runs and ends as a cold start does."""
    from corral.sandbox.namespace import NamespaceSandbox
    from corral.sandbox.spec import SandboxSpec

    prefork.prepare()
    try:
        assert len(prefork._slot) == 1
        child = prefork._slot[0].pid
        spec = SandboxSpec(
            argv=("sh", "-c", "echo in > out"), workspace=str(workspace),
            env=(("PATH", "/usr/bin:/bin"),),
        )  # fmt: skip
        running = NamespaceSandbox(spec).start()
        try:
            assert running.proc.pid == child
            assert running.wait(30).exit == 0
        finally:
            running.close()
    finally:
        prefork.discard()
    assert (workspace / "out").read_text() == "in\n"
    assert not alive(child)


def test_the_prepared_child_costs_the_sandbox_no_process_of_its_pids_limit(
    parked: tuple[int, int], frontend: Path, launcher_proc: Launcher, workspace: Path
) -> None:
    """The smallest `--pids` a cold start runs `sh` in (bwrap, its pid 1, the init, `sh`)
    is enough through the prepared child too: nothing of corral's stays charged to the
    sandbox's cgroup (a spawner that exited but was not yet reaped did, and failed this)."""
    cold = subprocess.run(
        corral_argv("--pids", "4", "--workspace", str(workspace), "--", "sh", "-c", "echo ok"),
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert (cold.returncode, cold.stdout) == (0, b"ok\n"), cold.stderr
    warm = _run(frontend, launcher_proc, workspace, "--pids", "4", "--", "sh", "-c", "echo ok")
    assert (warm.returncode, warm.stdout) == (0, b"ok\n"), warm.stderr
