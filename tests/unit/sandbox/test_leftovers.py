"""The host's leftover count identifies support processes by pid (pure)."""

from __future__ import annotations

from corral.sandbox.landlock import FS_MAKE_BLOCK, SCOPE_SIGNAL, LandlockRules, nested_plan, plan
from corral.sandbox.namespace import count_leftovers

MONITOR, PID1, INIT = 100, 101, 102


def test_support_processes_are_not_leftovers() -> None:
    procs = {
        MONITOR: (1, (MONITOR,)),
        PID1: (MONITOR, (PID1, 1)),
        INIT: (PID1, (INIT, 2)),
        200: (PID1, (200, 7)),  # a daemon reparented to pid 1
        201: (200, (201, 8)),
    }
    assert count_leftovers(procs, monitor=MONITOR, pid1=PID1) == 2
    # Without bwrap's child-pid, pid 1 is found by its namespace pid.
    assert count_leftovers(procs, monitor=MONITOR, pid1=None) == 2


def test_a_process_posing_as_the_init_is_counted() -> None:
    # ns pid 2 under another parent (a nested namespace's child) is not the init.
    procs = {
        MONITOR: (1, (MONITOR,)),
        PID1: (MONITOR, (PID1, 1)),
        300: (299, (300, 2)),
        299: (PID1, (299, 5)),
    }
    assert count_leftovers(procs, monitor=MONITOR, pid1=PID1) == 2


def test_dead_init_leaves_everything_counted() -> None:
    procs = {MONITOR: (1, (MONITOR,)), PID1: (MONITOR, (PID1, 1)), 200: (PID1, (200, 9))}
    assert count_leftovers(procs, monitor=MONITOR, pid1=PID1) == 1


def test_nested_plan_keeps_the_signal_scope() -> None:
    outer = plan(LandlockRules.from_dict({"read_only": ["/usr"], "read_write": []}), 7)
    inner = nested_plan(outer)
    assert inner.scoped & SCOPE_SIGNAL
    assert inner.handled_fs == FS_MAKE_BLOCK
    assert inner.paths == () and inner.ports == ()
