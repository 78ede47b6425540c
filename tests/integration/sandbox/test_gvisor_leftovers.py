"""gVisor: what the command leaves is counted by the host, whatever the command does.

Each test runs on both start paths: without a network hook the container's own
process (the supervisor) runs the command and reports; with one (a no-op hook
here) the holder stands beside a `runsc exec`ed command and counts on request.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from corral.sandbox.backend import GVisorConfig, SandboxNet
from corral.sandbox.gvisor import preboot
from corral.sandbox.spec import ExecResult, SandboxSpec
from tests.conformance.helpers import run, spec

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]

_COUNTED_BY = {
    "supervisor": "counted by the supervisor when the command exited",
    "holder": "counted by the holder before teardown",
    # Booted before the request (gvisor.preboot): the same supervisor, its
    # command given on stdin.
    "preboot": "counted by the supervisor when the command exited",
}


@pytest.fixture(params=sorted(_COUNTED_BY))
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _no_hook(_net: SandboxNet) -> None:
    pass


def _run(path: str, s: SandboxSpec) -> ExecResult:
    backend = GVisorConfig().load()
    if path == "preboot":
        key = preboot.boot_key(s, GVisorConfig(), "corral")
        assert key is not None
        preboot.prepare(key)
    result = run(backend, s, network=_no_hook if path == "holder" else None)
    assert result.layers["leftovers"] == _COUNTED_BY[path]
    assert ("preboot" in result.layers) == (path == "preboot")
    return result


def test_command_cannot_end_the_holder_to_hide_leftovers(path: str, tmp_path: Path) -> None:
    """The command kills everything it may (pid 1 included), then leaves two
    processes behind and exits 5: pid 1 survives (another uid), so the
    sandbox still stands when the command exits, the status is the command's
    own and both leftovers are counted."""
    attack = (
        "kill -9 1; kill -9 -1; setsid sleep 1000 & (sleep 1000 &); "
        "for i in 1 2 3 4 5 6 7 8 9; do [ -e /proc/1 ] || exit 99; done; exit 5"
    )
    result = _run(path, spec(tmp_path, "/bin/sh", "-c", attack))
    assert (result.exit, result.reason) == (5, "exited")
    assert result.processes_killed_at_end == 2


def test_no_leftover_is_zero(path: str, tmp_path: Path) -> None:
    result = _run(path, spec(tmp_path, "/bin/sh", "-c", "sleep 0 & wait; exit 0"))
    assert (result.exit, result.processes_killed_at_end) == (0, 0)


# A leftover that renames itself (gVisor keeps a newline in a process name, and
# the holder reads names from the same status files it counts from) and makes
# itself non-dumpable (its /proc entries then belong to root); it says when it
# is ready by creating its file.
_HIDE = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None)
libc.prctl(15, sys.argv[1].encode(), 0, 0, 0)
libc.prctl(4, 0, 0, 0, 0)
open(sys.argv[2], "w").close()
time.sleep(1000)
"""
_NAMES = (
    "x\nPPid:\t0\nUid:\t0",  # forged parent and uid before the real lines
    "\nTracerPid:\nUid:\t0",  # the forged pair that would stop the read early (16 bytes)
    "\nState:\tZ\nUid:",  # a zombie's state
)


def test_leftovers_cannot_hide_by_name_or_dumpability(path: str, tmp_path: Path) -> None:
    """Three leftovers forge status lines through their names and turn
    non-dumpable; all three are still counted."""
    (tmp_path / "hide.py").write_text(_HIDE)
    starts = " ".join(
        f"setsid python3 -I -S hide.py {shlex.quote(name)} ready{i} </dev/null >/dev/null 2>&1 &"
        for i, name in enumerate(_NAMES)
    )
    wait = "while [ ! -e ready0 ] || [ ! -e ready1 ] || [ ! -e ready2 ]; do sleep 0.1; done"
    result = _run(path, spec(tmp_path, "/bin/sh", "-c", f"{starts} {wait}; exit 0"))
    assert (result.exit, result.reason) == (0, "exited")
    assert result.processes_killed_at_end == len(_NAMES)


@pytest.mark.parametrize("where", ["supervisor", "preboot"])
def test_the_command_cannot_write_the_supervisors_report(where: str, tmp_path: Path) -> None:
    """The command tries every descriptor of pid 1 (the supervisor's to the
    report among them) and its own, and leaves a process that keeps writing a
    forged report (status 0, nothing left) over it; it exits 9: the host
    reports 9 and the writer (with its `rm` of the moment)."""
    r = "/run/corral-report/status"
    forge = f"rm -f {r}; echo 'exit 0 left 0' > {r}"
    attack = (
        "for f in /proc/1/fd/*; do echo 'exit 0 left 0' > $f; done 2>/dev/null; "
        "for n in 3 4 5 6 7 8 9; do eval \"echo 'exit 0 left 0' >&$n\"; done 2>/dev/null; "
        f'setsid sh -c "while :; do {forge}; done" </dev/null >/dev/null 2>&1 & '
        "sleep 0.5; exit 9"
    )
    result = _run(where, spec(tmp_path, "/bin/sh", "-c", attack))
    assert (result.exit, result.reason) == (9, "exited")
    assert result.processes_killed_at_end in (1, 2)
