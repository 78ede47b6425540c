"""The M14/M15 judges: terminal state diffs and shared host uids (pure)."""

from __future__ import annotations

from corral.verify.model import Evidence
from corral.verify.probes.terminal_and_uids import SharedHostUid
from corral.verify.runner import _tty_changes


def _status(*uids: int) -> list[dict[str, str]]:
    return [{"pid": str(100 + i), "Uid": f"{u}\t{u}\t{u}\t{u}"} for i, u in enumerate(uids)]


def test_shared_uid_is_allowed_distinct_uids_denied() -> None:
    judge = SharedHostUid()
    shared = Evidence(facts={"host_status": _status(64000), "neighbour_status": _status(64000)})
    assert judge.judge(shared).observed == "allowed"
    apart = Evidence(facts={"host_status": _status(64001), "neighbour_status": _status(64000)})
    assert judge.judge(apart).observed == "denied"


def test_missing_processes_are_an_error_not_a_pass() -> None:
    judge = SharedHostUid()
    assert judge.judge(Evidence(facts={"host_status": _status(64001)})).observed == "error"
    assert judge.judge(Evidence(facts={"neighbour_status": _status(1)})).observed == "error"


def test_tty_changes_names_what_differs() -> None:
    attrs = [0, 0, 0, 0, 0, 0, [b"\0"] * 32]
    before = ((24, 80), attrs, 0)
    assert _tty_changes(before, ((24, 80), list(attrs), 0)) == ""
    changed = _tty_changes(before, ((7, 13), [1, *attrs[1:]], 1))
    assert "window size (24, 80) -> (7, 13)" in changed
    assert "termios" in changed and "exclusive mode 0 -> 1" in changed
