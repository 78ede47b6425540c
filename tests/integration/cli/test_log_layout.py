"""`corral log` is readable at 80 and 200 columns and line-per-record when piped (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.broker.actions import HttpRequest, Identity, NetConnect, Observation
from corral.broker.journal import Journal
from tests.integration.cli.ptyterm import plain, run_in_pty, run_piped

LONG_PATH = "/simple/" + "averyveryverylongpackagename-" * 3
SHORT = ("evil.test:443", "default-deny", "no rule admits evil.test:443", "allow:pypi.test")


def _fill(path: Path) -> None:
    who = Identity(run="r1", session="s1", env="agent")
    with Journal(path) as journal:
        rid = journal.append(
            Observation.of(
                HttpRequest(host="pypi.test", port=80, method="GET", path=LONG_PATH),
                who,
                decision="allow",
                rule="allow:pypi.test",
                reason="admitted by rule allow:pypi.test",
            )
        )
        journal.record_outcome(rid, 0, 1234, {"status": 200})
        journal.append(
            Observation.of(
                NetConnect(host="evil.test", port=443),
                who,
                decision="deny",
                rule="default-deny",
                reason="no rule admits evil.test:443",
            )
        )


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    return path


@pytest.mark.parametrize("columns", [80, 200])
def test_terminal_keeps_every_field_readable(journal: Path, columns: int) -> None:
    rc, out = run_in_pty(["log", str(journal)], columns)
    assert rc == 0, out
    lines = plain(out).splitlines()
    assert max(len(line) for line in lines) <= columns
    for value in SHORT:
        # Whole, on one line: a zero-width column would fold it a character a line.
        assert any(value in line for line in lines), (value, out)
    # The long target folds but nothing of it is lost.
    flat = "".join(line.strip(" │|") for line in lines).replace(" ", "")
    assert LONG_PATH.replace(" ", "") in flat.replace("│", "")
    assert not [line for line in lines if len(line.strip(" │")) == 1]


def test_piped_is_one_plain_line_per_record(journal: Path) -> None:
    result = run_piped(["log", str(journal)])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    assert "\t" not in result.stdout and "\x1b" not in result.stdout
    assert lines[0].startswith("id=1 ")
    assert f'target="GET http://pypi.test:80{LONG_PATH}"' in lines[0]
    assert "decision=deny target=evil.test:443 rule=default-deny" in lines[1]
    assert 'reason="no rule admits evil.test:443" bytes=0/0' in lines[1]
