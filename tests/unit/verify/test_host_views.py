"""The M13 mission oracles (pure): host views of a hostile run, names committed as bytes."""

from __future__ import annotations

from typing import Any

import pytest

from corral.verify.host_views import HostViewsInert, NamesCommitted, terminal_problems
from corral.verify.model import Evidence

MARKER = "cvm0123"
TOKEN = f"cvt-{MARKER}"


def _views(**override: dict[str, Any]) -> dict[str, dict[str, Any]]:
    ok = {"rc": 0, "stdout": "\x1b[1mGET http://x.example:80/[/x]\x1b[0m\n", "stderr": ""}
    views = {
        "corral log": dict(ok),
        "corral log --denied": dict(ok),
        "corral log --json": {"rc": 0, "stdout": '{"target": "[/x]"}\n', "stderr": ""},
        "corral status": dict(ok),
        "corral status --json": {"rc": 0, "stdout": '{"id": "r"}\n', "stderr": ""},
    }
    views.update(override)
    return views


def _text_ev(views: dict[str, Any] | None = None, report: str | None = None) -> Evidence:
    return Evidence(
        facts={
            "host_views": _views() if views is None else views,
            "report_md": f"| 1 | done | agent failed\\: {TOKEN} &lt;script&gt; |"
            if report is None
            else report,
            "run_state": "passed",
        },
        journal=({"target": "GET http://x.example:80/[/x]", "decision": "deny"},),
        ctx={"marker": MARKER},
    )


def test_inert_views_are_denied() -> None:
    assert HostViewsInert().judge(_text_ev()).observed == "denied"


@pytest.mark.parametrize(
    ("label", "view"),
    [
        ("corral log --denied", {"rc": 1, "stdout": "", "stderr": "rich.errors.MarkupError: x"}),
        ("corral log", {"rc": 0, "stdout": "\x1b]8;;file:///etc/passwd\x1b\\x", "stderr": ""}),
        ("corral log", {"rc": 0, "stdout": "ok\rspoof", "stderr": ""}),
        ("corral status", {"rc": 0, "stdout": "\u202etxt", "stderr": ""}),
        ("corral status", {"rc": 0, "stdout": "\x9b2J", "stderr": ""}),
        ("corral log --json", {"rc": 0, "stdout": "not json\n", "stderr": ""}),
    ],
)
def test_a_view_that_acts_on_data_is_allowed(label: str, view: dict[str, Any]) -> None:
    j = HostViewsInert().judge(_text_ev(_views(**{label: view})))
    assert j.observed == "allowed" and label in j.why


def test_raw_html_in_report_is_allowed() -> None:
    j = HostViewsInert().judge(_text_ev(report=f"agent failed: {TOKEN} <script>alert(1)"))
    assert j.observed == "allowed" and "report.md" in j.why


def test_unexercised_attack_is_an_error() -> None:
    assert HostViewsInert().judge(_text_ev(report="nothing quoted")).observed == "error"
    ev = _text_ev()
    no_journal = Evidence(facts=ev.facts, journal=(), ctx=ev.ctx)
    assert HostViewsInert().judge(no_journal).observed == "error"
    assert HostViewsInert().judge(Evidence(ctx=ev.ctx)).observed == "error"


def test_terminal_problems() -> None:
    assert terminal_problems("\x1b[1;31mred\x1b[0m plain") == []
    assert terminal_problems("\x1b[2J")  # CSI but not SGR
    assert terminal_problems("a\x07b")


PLANTED = {b"bad\xff.txt".hex(): "d1", b'"..\\057state.sqlite"'.hex(): "d2"}


def _names_ev(blobs: dict[str, str], snap: list[str], sessions: int = 2) -> Evidence:
    return Evidence(
        results=({"ok": True, "planted": PLANTED},),
        facts={
            "run_state": "passed",
            "commit_blobs": blobs,
            "snapshot_names": snap,
            "mission_sessions": [{"n": n, "commit": "c"} for n in range(1, sessions + 1)],
        },
    )


def test_names_committed_with_their_content_are_denied() -> None:
    ev = _names_ev(dict(PLANTED), list(PLANTED))
    assert NamesCommitted().judge(ev).observed == "denied"


def test_names_not_committed_or_misread_are_allowed() -> None:
    assert NamesCommitted().judge(_names_ev({}, [])).observed == "allowed"
    misread = {**PLANTED, b'"..\\057state.sqlite"'.hex(): "host-file-digest"}
    j = NamesCommitted().judge(_names_ev(misread, list(PLANTED)))
    assert j.observed == "allowed" and "not what the agent wrote" in j.why
    missing = {b"bad\xff.txt".hex(): "d1"}
    assert NamesCommitted().judge(_names_ev(missing, list(PLANTED))).observed == "allowed"
    assert NamesCommitted().judge(_names_ev(dict(PLANTED), [])).observed == "allowed"
    assert NamesCommitted().judge(_names_ev(dict(PLANTED), list(PLANTED), 1)).observed == "allowed"


def test_names_without_a_report_are_an_error() -> None:
    assert NamesCommitted().judge(Evidence()).observed == "error"
