"""Which standard streams go through corral's pty (pure)."""

from __future__ import annotations

from corral.sandbox.terminal import StdioPlan, plan_stdio


def test_no_terminal_no_pty() -> None:
    assert plan_stdio((False, False, False)) is None


def test_all_terminals_share_the_pty() -> None:
    assert plan_stdio((True, True, True)) == StdioPlan((True, True, True), 0, 1)


def test_only_the_terminal_streams_go_through() -> None:
    # `corral exec -- cmd > file`: stdin typed, stdout straight to the file.
    assert plan_stdio((True, False, True)) == StdioPlan((True, False, True), 0, 2)
    # `… < file`: output relayed, nothing read from the terminal.
    assert plan_stdio((False, True, False)) == StdioPlan((False, True, False), None, 1)
    # Only stdin is a terminal: echo goes back to it.
    assert plan_stdio((True, False, False)) == StdioPlan((True, False, False), 0, 0)


def test_a_background_corral_gives_the_sandbox_eof_not_the_terminal() -> None:
    plan = plan_stdio((True, True, True), foreground=False)
    assert plan == StdioPlan((False, True, True), None, 1, null_stdin=True)
