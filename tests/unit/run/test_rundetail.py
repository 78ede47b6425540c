"""report.md / `corral status RUN` detail: denied actions and teardown kills, bounded."""

from __future__ import annotations

from pathlib import Path

from corral.broker.actions import FileOp, Identity, Observation, ProcessEvent
from corral.broker.journal import Journal
from corral.run.report import render_detail
from corral.run.rundetail import TOP_DENIED, run_detail
from corral.run.statusview import detail_lines
from corral.run.store import CheckResult

WHO = Identity(run="r1", session="1", env="agent")


def _journal(tmp_path: Path) -> Path:
    path = tmp_path / "journal.sqlite"
    hostile = "/etc/\x1b]0;owned\x07|x|\n| fake | row |" + "A" * 50_000
    with Journal(path) as j:
        for _ in range(5):
            j.append(
                Observation.of(
                    FileOp(op="read", path=hostile),
                    WHO,
                    decision="deny",
                    rule="ro|rule",
                    reason="no",
                )
            )
        for i in range(TOP_DENIED + 3):
            for _ in range(2):
                j.append(
                    Observation.of(
                        FileOp(op="write", path=f"/x{i}"),
                        WHO,
                        decision="deny",
                        rule=None,
                        reason="no",
                    )
                )
        j.append(
            Observation.of(
                FileOp(op="read", path="/ok"), WHO, decision="allow", rule="r", reason="ok"
            )
        )
        j.append(
            Observation.of(
                ProcessEvent(event="killed_at_teardown"),
                Identity(run="r1", session="1", env="product"),
                decision="observe",
                rule=None,
                reason="2 process(es) killed when the task ended",
                detail={"count": 2, "names": ["python3", "\x1b[2J|x|\u202e"]},
            )
        )
        other = Identity(run="r2", session="1", env="agent")
        j.append(
            Observation.of(
                FileOp(op="read", path="/other-run"), other, decision="deny", rule=None, reason="no"
            )
        )
    return path


def test_detail_lists_top_denied_and_killed_names_escaped(tmp_path: Path) -> None:
    d = run_detail(
        _journal(tmp_path), "r1", [CheckResult("c", False, "status 501, expected 201", 1, 0.1)]
    )
    assert len(d.denied) == TOP_DENIED and d.denied_groups_left_off == 4
    top = d.denied[0]
    assert top.count == 5 and top.kind == "file_op" and top.rule == "ro|rule"
    assert top.target.startswith("read /etc/\\x1b]0;owned\\x07|x|\\n| fake | row |")
    assert len(top.target) < 260
    assert all("/other-run" not in a.target for a in d.denied)
    (k,) = d.killed
    assert (k.env, k.session, k.count) == ("product", "1", 2)
    assert k.names == ("python3", "\\x1b[2J|x|\\u202e")

    report = render_detail(d)
    assert "\x1b" not in report and "\u202e" not in report
    table = [ln for ln in report.splitlines() if ln.startswith("| ")]
    # header + TOP_DENIED rows + header + one kill row; no forged row.
    assert len(table) == 1 + TOP_DENIED + 1 + 1
    assert "and 4 more" in report

    assert d.failed_checks == (("c", "status 501, expected 201"),)
    doc = d.to_json_dict()
    assert doc["killed_at_teardown"][0]["names"] == ["python3", "\\x1b[2J|x|\\u202e"]
    assert doc["denied_actions"][0]["count"] == 5


def test_status_detail_lines_are_one_line_each(tmp_path: Path) -> None:
    from corral.run.control import RunStatus
    from corral.run.store import RunRecord

    run = RunRecord(
        id="r1",
        mission="m",
        state="failed",
        agent="script",
        provider="synthetic:x",
        max_sessions=1,
        created="t",
        updated="t",
        coordinator_pid=None,
        stop_requested=False,
        end_reason=None,
        memory_cap=1,
        peak_memory=0,
        base_commit=None,
        last_commit=None,
    )
    d = run_detail(
        _journal(tmp_path), "r1", [CheckResult("c\nx", False, "bad\x1b[2J\nline", 1, 0.1)]
    )
    lines = detail_lines(RunStatus(run, (), False, 0, 0, None, d))
    assert lines[0] == "failed check c\\nx: bad\\x1b[2J\\nline"
    assert all("\n" not in ln and "\x1b" not in ln for ln in lines)
    assert lines[-1] == "killed at teardown: 2 in product session 1: python3, \\x1b[2J|x|\\u202e"
    assert any(ln.startswith("denied 5x file_op read /etc/") for ln in lines)
