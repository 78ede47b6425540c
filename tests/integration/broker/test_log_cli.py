"""`corral log FILE [--denied] [--kind K] [--json] [--follow]`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from corral.broker.actions import HttpRequest, Identity, NetConnect, Observation
from corral.broker.cli import register
from corral.broker.journal import Journal

KEYS = {"time", "run", "session", "env", "kind", "target", "decision", "rule", "reason", "detail"}
APP_SCRIPT = (
    "import typer\n"
    "from corral.broker.cli import register\n"
    "app = typer.Typer()\n"
    "app.callback()(lambda: None)\n"
    "register(app)\n"
    "app()\n"
)


def _app() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    return app


def _fill(path: Path) -> None:
    who = Identity(run="r1", session="s1", env="agent")
    with Journal(path) as journal:
        rid = journal.append(
            Observation.of(
                HttpRequest(host="pypi.test", port=80, method="GET", path="/simple/"),
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


def test_json_lines_have_the_design_shape(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    result = CliRunner().invoke(_app(), ["log", str(path), "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [set(line) for line in lines] == [KEYS, KEYS]
    assert [(x["kind"], x["decision"]) for x in lines] == [
        ("http_request", "allow"),
        ("net_connect", "deny"),
    ]
    assert lines[0]["detail"]["bytes_down"] == 1234
    denied = CliRunner().invoke(_app(), ["log", str(tmp_path), "--json", "--denied"])
    assert [json.loads(x)["target"] for x in denied.stdout.splitlines()] == ["evil.test:443"]
    kind = CliRunner().invoke(_app(), ["log", str(path), "--json", "--kind", "http_request"])
    assert [json.loads(x)["kind"] for x in kind.stdout.splitlines()] == ["http_request"]


def test_table(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    result = CliRunner().invoke(_app(), ["log", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "evil.test:443" in result.stdout
    assert "default-deny" in result.stdout
    assert "0/1234" in result.stdout


def test_missing_journal(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["log", str(tmp_path / "none.sqlite")])
    assert result.exit_code == 1


@pytest.mark.timeout(30)
def test_follow_prints_new_rows(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    proc = subprocess.Popen(
        [sys.executable, "-c", APP_SCRIPT, "log", str(path), "--json", "--follow"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert [x["detail"]["id"] for x in first] == [1, 2]
        time.sleep(0.3)
        with Journal(path) as journal:
            journal.append(
                Observation.of(
                    NetConnect(host="late.test", port=443),
                    Identity(),
                    decision="deny",
                    rule="default-deny",
                    reason="late",
                )
            )
        third = json.loads(proc.stdout.readline())
        assert third["target"] == "late.test:443"
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
