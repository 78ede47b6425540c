"""gVisor: what the command leaves is counted by the host, whatever the command does."""

from __future__ import annotations

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
    own and `runsc ps` counts both leftovers."""
    attack = (
        "kill -9 1; kill -9 -1; setsid sleep 1000 & (sleep 1000 &); "
        "for i in 1 2 3 4 5 6 7 8 9; do [ -e /proc/1 ] || exit 99; done; exit 5"
    )
    result = run(GVisorConfig().load(), spec(tmp_path, "/bin/sh", "-c", attack))
    assert (result.exit, result.reason) == (5, "exited")
    assert result.processes_killed_at_end == 2
    assert result.layers["leftovers"] == "counted by runsc ps before teardown"


def test_no_leftover_is_zero(tmp_path: Path) -> None:
    result = run(GVisorConfig().load(), spec(tmp_path, "/bin/sh", "-c", "sleep 0 & wait; exit 0"))
    assert (result.exit, result.processes_killed_at_end) == (0, 0)
