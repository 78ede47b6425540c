"""The launcher's warm worker (issue 13): forked ahead of a request, never a way around a check.

A warm worker is a fork of the launcher waiting on a socketpair for the next
connection. These tests attack what that could weaken: that stale code never
serves (an edit after the warm fork), that a dead launcher leaves nothing
waiting, and that the warm worker holds nothing a sandbox or another process
could use to reach the launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.exec import launcher
from corral.sandbox import prefork, uids

from .conftest import processes_with, wait_for
from .test_launcher import (
    Launcher,
    alive,
    children_of,
    comm,
    frontend,
    launcher_proc,
    listener_pid,
)

pytestmark = [pytest.mark.requires_sandbox]

__all__ = ["frontend", "launcher_proc"]


@pytest.fixture
def warm(launcher_proc: Launcher) -> Iterator[int]:
    assert wait_for(lambda: len(launcher_proc.warm()) == 1, 30), children_of(launcher_proc.pid)
    (pid,) = launcher_proc.warm()
    yield pid


def _run(
    frontend: Path, launcher_proc: Launcher, cwd: Path, *cmd: str, require: bool = True
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(frontend), "exec", "--", *cmd],
        cwd=cwd, env=launcher_proc.env(require=require), capture_output=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_the_warm_worker_serves_the_next_request(
    frontend: Path, launcher_proc: Launcher, warm: int, workspace: Path
) -> None:
    """The request is served by the worker forked ahead, and a new one is forked after it."""
    proc = subprocess.Popen(
        [str(frontend), "exec", "--", "sh", "-c", "echo $PPID; sleep 60"],
        cwd=workspace, env=launcher_proc.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        # Serving: it is a worker now, its sandbox its child, and no second warm one meanwhile.
        assert launcher_proc.workers() == [warm]
        assert children_of(warm)
        assert launcher_proc.warm() == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert wait_for(lambda: len(launcher_proc.warm()) == 1 and not alive(warm), 30)


def test_a_warm_worker_forked_before_an_edit_never_serves(
    frontend: Path, launcher_proc: Launcher, warm: int, workspace: Path
) -> None:
    """Stale code never runs: the edit retires the launcher and its unused warm worker."""
    victim = Path(launcher.source_root()) / "corral" / "exec" / "__init__.py"
    st = victim.stat()
    # Same times, so nothing else notices (no .pyc is invalidated); inotify sees the change.
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = subprocess.Popen(
        [str(frontend), "exec", "--", "sh", "-c", "echo started; sleep 60"],
        cwd=workspace, env=launcher_proc.env(require=False), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        # Served, but not by the worker forked before the edit: it has no sandbox.
        assert not alive(warm) or children_of(warm) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    launcher_proc.proc.wait(30)
    assert wait_for(lambda: not alive(warm), 30), "a stale warm worker outlived its launcher"
    assert wait_for(lambda: listener_pid(launcher_proc.socket) not in (None, launcher_proc.pid), 60)


def test_kill9_of_the_launcher_retires_its_warm_worker(
    frontend: Path, launcher_proc: Launcher, warm: int, workspace: Path
) -> None:
    """No launcher, no worker waiting: the socketpair's EOF ends it (nothing else holds it)."""
    os.kill(launcher_proc.pid, signal.SIGKILL)
    launcher_proc.proc.wait()
    assert wait_for(lambda: not alive(warm), 30), "the warm worker outlived a killed launcher"
    proc = _run(frontend, launcher_proc, workspace, "sh", "-c", "echo fallback", require=False)
    assert (proc.returncode, proc.stdout) == (0, b"fallback\n"), proc.stderr
    # The fallback started a launcher: listening, so that the fixture stops it.
    assert wait_for(lambda: listener_pid(launcher_proc.socket) is not None, 60)


def test_the_warm_worker_holds_no_way_to_the_launcher(launcher_proc: Launcher, warm: int) -> None:
    """Its descriptors: stdio and its end of one socketpair; nothing of the launcher's.

    Not the listening socket (a warm worker accepting by itself would bypass
    the launcher's checks), not the lock, the inotify instance or the wakeup
    pipe; and its socket is unnamed (no path a sandbox or a process could connect to).
    """
    unix: dict[int, str] = {}
    accepting: set[int] = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        unix[int(fields[6])] = fields[7] if len(fields) > 7 else ""
        if int(fields[3], 16) & 0x10000:  # __SO_ACCEPTCON: a listening socket
            accepting.add(int(fields[6]))
    held = {
        fd: os.readlink(f"/proc/{warm}/fd/{fd}")
        for fd in os.listdir(f"/proc/{warm}/fd")
        if int(fd) > 2
    }
    # As root, also what it prepared for its sandbox (sandbox.prewarm): the uid lease and
    # the idmap user namespace.
    prepared = [
        link
        for link in held.values()
        if link.startswith("user:[") or link.startswith(f"{uids.LOCK_DIR}/")
    ]
    assert len(prepared) == (2 if os.geteuid() == 0 else 0), held
    # Its own mount table, read ahead (`layers.prepare`): valid while it polls no change.
    prepared += [link for link in held.values() if link == f"/proc/{warm}/mountinfo"]
    assert len(prepared) == (3 if os.geteuid() == 0 else 1), held
    # And, as root, its end of the socketpair to its parked sandbox child (sandbox.prefork),
    # whose other end only that child holds.
    spawned = [p for p in children_of(warm) if comm(p) == prefork.SPAWN_COMM]
    assert len(spawned) == (1 if os.geteuid() == 0 else 0), children_of(warm)
    for child in spawned:
        theirs = _held_above_stdio(child)
        assert len(theirs) == 1 and theirs[0].startswith("socket:["), theirs
        peer = _unix_peer(int(theirs[0][len("socket:[") : -1]))
        mine = f"socket:[{peer}]"
        assert mine in held.values(), (peer, held)
        prepared.append(mine)
    rest = [link for link in held.values() if link not in prepared]
    assert len(rest) == 1, held
    (link,) = rest
    assert link.startswith("socket:["), held
    inode = int(link[len("socket:[") : -1])
    assert unix.get(inode) == "", (inode, unix.get(inode))
    launchers = {
        int(link[len("socket:[") : -1])
        for fd in os.listdir(f"/proc/{launcher_proc.pid}/fd")
        if (link := os.readlink(f"/proc/{launcher_proc.pid}/fd/{fd}")).startswith("socket:[")
    }
    listening = launchers & accepting
    assert listening and inode not in listening


def _held_above_stdio(pid: int) -> list[str]:
    return [
        os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd") if int(fd) > 2
    ]


def _unix_peer(inode: int) -> int:
    """The inode of the other end of a connected unix socket (`ss -x`)."""
    out = subprocess.run(["ss", "-x", "-a", "-n"], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[5] == str(inode):
            return int(fields[7])
    raise AssertionError(f"socket {inode} not listed by ss")


@pytest.mark.requires_root
def test_the_requests_uid_range_beats_what_the_warm_worker_prepared(
    frontend: Path, launcher_proc: Launcher, warm: int, workspace: Path, marker: str
) -> None:
    """The warm worker took a uid from the launcher's range; the caller asked for another.

    `CORRAL_UID_RANGE` is the caller's: its sandbox must run as an id of that range
    (host side: the uid the kernel shows for the sandbox's command).
    """
    env = {**launcher_proc.env(), "CORRAL_UID_RANGE": "65100-65199"}
    proc = subprocess.Popen(
        [str(frontend), "exec", "--", "sh", "-c", "echo started; sleep 60", marker],
        cwd=workspace, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        assert launcher_proc.workers() == [warm]  # the warm worker serves it
        host_uids = set()
        for pid in processes_with(marker):
            if pid == proc.pid:
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Uid:"):
                    host_uids.add(int(line.split()[1]))
        assert host_uids, "no sandbox process found"
        assert all(65100 <= u <= 65199 for u in host_uids - {0}), host_uids
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
