"""gVisor: what the command leaves is counted by the host, whatever the command does."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from corral.sandbox.backend import GVisorConfig
from tests.conformance.helpers import run, spec

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
]


def test_command_cannot_end_the_holder_to_hide_leftovers(tmp_path: Path) -> None:
    """The command kills everything it may (pid 1 included), then leaves two
    processes behind and exits 5: the holder survives (another uid), so the
    sandbox still stands when the command exits, the status is the command's
    own and the holder counts both leftovers."""
    attack = (
        "kill -9 1; kill -9 -1; setsid sleep 1000 & (sleep 1000 &); "
        "for i in 1 2 3 4 5 6 7 8 9; do [ -e /proc/1 ] || exit 99; done; exit 5"
    )
    result = run(GVisorConfig().load(), spec(tmp_path, "/bin/sh", "-c", attack))
    assert (result.exit, result.reason) == (5, "exited")
    assert result.processes_killed_at_end == 2
    assert result.layers["leftovers"] == "counted by the holder before teardown"


def test_no_leftover_is_zero(tmp_path: Path) -> None:
    result = run(GVisorConfig().load(), spec(tmp_path, "/bin/sh", "-c", "sleep 0 & wait; exit 0"))
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


def test_leftovers_cannot_hide_by_name_or_dumpability(tmp_path: Path) -> None:
    """Three leftovers forge status lines through their names and turn
    non-dumpable; all three are still counted."""
    (tmp_path / "hide.py").write_text(_HIDE)
    starts = " ".join(
        f"setsid python3 -I -S hide.py {shlex.quote(name)} ready{i} </dev/null >/dev/null 2>&1 &"
        for i, name in enumerate(_NAMES)
    )
    wait = "while [ ! -e ready0 ] || [ ! -e ready1 ] || [ ! -e ready2 ]; do sleep 0.1; done"
    result = run(GVisorConfig().load(), spec(tmp_path, "/bin/sh", "-c", f"{starts} {wait}; exit 0"))
    assert (result.exit, result.reason) == (0, "exited")
    assert result.layers["leftovers"] == "counted by the holder before teardown"
    assert result.processes_killed_at_end == len(_NAMES)
