"""The exit report's pure cores: host-side leftover count and exit status (issue 9 item 4)."""

from __future__ import annotations

from corral.sandbox.landlock import FS_MAKE_BLOCK, SCOPE_SIGNAL, LandlockRules, nested_plan, plan
from corral.sandbox.namespace import count_leftovers, decide_exit

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


def _decide(
    host: int | None, exit_ev: dict[str, object] | None, **over: object
) -> tuple[int, str, str]:
    args: dict[str, object] = {
        "host_code": host,
        "bwrap_rc": host,
        "exit_ev": exit_ev,
        "err_ev": None,
        "oom_kills": 0,
        "timed_out": False,
        "interrupted": 0,
    }
    args.update(over)
    return decide_exit(**args)  # type: ignore[arg-type]


def test_exit_status_is_bwraps() -> None:
    assert _decide(3, {"code": 3, "signal": 0})[:2] == (3, "exited")
    assert _decide(143, {"code": 143, "signal": 15})[:2] == (143, "killed")
    # The init itself was killed: no exit event, bwrap says 137.
    assert _decide(137, None)[:2] == (137, "killed")
    assert _decide(137, None, oom_kills=1)[:2] == (137, "oom")
    err = {"code": 125, "message": "Landlock could not be applied: x"}
    assert _decide(125, None, err_ev=err) == (125, "refused", err["message"])


def test_disagreeing_reports_fail_closed() -> None:
    # A forged exit event (or a forged pid 1) must never yield a success.
    assert _decide(3, {"code": 0, "signal": 0})[:2] == (125, "refused")
    assert _decide(0, {"code": 3, "signal": 0})[:2] == (125, "refused")
    assert _decide(0, None)[:2] == (125, "refused")
    assert _decide(0, {"code": None})[:2] == (125, "refused")
    assert _decide(0, {"code": 0, "signal": 0})[:2] == (0, "exited")


def test_no_bwrap_status() -> None:
    assert _decide(None, None, bwrap_rc=1)[:2] == (125, "refused")
    assert _decide(None, None, bwrap_rc=-9)[:2] == (137, "killed")
    assert _decide(None, None, timed_out=True)[:2] == (124, "timeout")
