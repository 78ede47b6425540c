"""gVisor: each sandbox's sentry and stubs run as a host uid of its own.

The attack is what a sandbox that escaped its sentry could do next: act
with the sentry's host uid against another gVisor sandbox. The test plays
that escapee from the host (a process with sandbox A's sentry uid) and
signals sandbox B's sentry: the kernel must refuse it (EPERM), while the
same process may signal A's own sentry (the escapee is real). With the
shared uid 65534 both signals were delivered.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.sandbox.backend import GVisorConfig
from corral.sandbox.gvisor import ps
from tests.conformance.helpers import spec, until

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]

_NOBODY = 65534


def _uid(pid: int) -> int | None:
    """The host task's effective uid; None once it is gone (a platform stub of an
    address space that an exec replaced exits at any time)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except FileNotFoundError:
        return None
    raise AssertionError(f"no Uid line for {pid}")


def _sentry(tasks: list[int]) -> int:
    """The sentry among a sandbox's host tasks (it lives as long as the sandbox)."""
    for pid in tasks:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if fh.read(64).startswith(b"runsc-sandbox\0"):
                return pid
    raise AssertionError(f"no sentry among {tasks}")


def _signal_as(uid: int, pid: int) -> int:
    """errno of kill(pid, 0) from a child running as host `uid` (0 when delivered)."""
    child = os.fork()
    if child == 0:  # pragma: no cover - child
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(pid, 0)
            os._exit(0)
        except PermissionError:
            os._exit(1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), f"escapee child failed ({code})"
    return code


@pytest.fixture
def two_sandboxes(tmp_path: Path) -> Iterator[list[list[int]]]:
    backend = GVisorConfig().load()
    started = []
    try:
        for name in ("a", "b"):
            ws = tmp_path / name
            ws.mkdir()
            started.append(backend.start(spec(ws, "/bin/sleep", "60")))
        located: list[ps.Located] = []

        def both_up() -> bool:
            located[:] = ps.find_sandboxes(os.getpid())
            return len(located) == 2 and all(ps.host_tasks(s) for s in located)

        until(both_up, "both sentries run", 60)
        yield [ps.host_tasks(s) for s in located]
    finally:
        for sb in started:
            sb.close()


def test_each_sandbox_runs_as_its_own_host_uid(two_sandboxes: list[list[int]]) -> None:
    a, b = two_sandboxes
    uids_a, uids_b = {_uid(p) for p in a} - {None}, {_uid(p) for p in b} - {None}
    assert len(uids_a) == 1 and len(uids_b) == 1, (uids_a, uids_b)
    assert uids_a.isdisjoint(uids_b), (uids_a, uids_b)
    assert not ({0, _NOBODY} & (uids_a | uids_b)), (uids_a, uids_b)


def test_an_escaped_sentry_cannot_signal_another_sandbox(two_sandboxes: list[list[int]]) -> None:
    a, b = _sentry(two_sandboxes[0]), _sentry(two_sandboxes[1])
    escapee = _uid(a)
    assert escapee is not None
    assert _signal_as(escapee, a) == 0  # its own sentry: the uid is the one that runs it
    assert _signal_as(escapee, b) == 1, "sandbox A's host uid may signal sandbox B's sentry"
