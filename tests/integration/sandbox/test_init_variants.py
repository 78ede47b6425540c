"""Both in-sandbox inits (compiled init.c and the init.py fallback) keep the same contract."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

import pytest

from corral.exec.cli import sandbox_env
from corral.sandbox.namespace import ExecResult, NamespaceSandbox
from corral.sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.requires_sandbox]

KINDS: list[Literal["c", "python"]] = ["c", "python"]


def _run(ws: Path, kind: Literal["c", "python"], *argv: str) -> ExecResult:
    spec = SandboxSpec(
        argv=argv, workspace=str(ws), env=tuple(sorted(sandbox_env("/home/corral", {}).items()))
    )
    running = NamespaceSandbox(spec, init_kind=kind).start()
    try:
        return running.wait(60)
    finally:
        running.close()


@pytest.mark.parametrize("kind", KINDS)
def test_exit_status_and_layers(kind: Literal["c", "python"], workspace: Path) -> None:
    result = _run(workspace, kind, "sh", "-c", "exit 3")
    assert result.exit == 3
    assert result.layers["init"] == kind
    assert result.layers["landlock"] == 7 or isinstance(result.layers["landlock"], int)


@pytest.mark.parametrize("kind", KINDS)
def test_landlock_applied(kind: Literal["c", "python"], workspace: Path, tmp_path: Path) -> None:
    secret = f"LL-{secrets.token_hex(6)}"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text(secret)
    (workspace / "link").symlink_to(outside / "secret")
    # The target is not mounted at all; the "landlock" event proves the ruleset was applied.
    result = _run(workspace, kind, "sh", "-c", "cat link > out.txt 2>&1; ls / > ls.txt 2>&1; true")
    assert result.exit == 0
    assert secret not in (workspace / "out.txt").read_text()
    assert any(e.get("event") == "landlock" for e in result.events)


@pytest.mark.parametrize("kind", KINDS)
def test_not_found_and_not_executable(kind: Literal["c", "python"], workspace: Path) -> None:
    assert _run(workspace, kind, "no-such-tool").exit == 127
    (workspace / "notexec").write_text("#!/bin/sh\n")
    assert _run(workspace, kind, str(workspace / "notexec")).exit == 126


@pytest.mark.parametrize("kind", KINDS)
def test_counts_leftovers_and_signals(kind: Literal["c", "python"], workspace: Path) -> None:
    result = _run(workspace, kind, "sh", "-c", "sleep 100 & sleep 100 & kill -TERM $$")
    assert result.exit == 128 + 15
    assert result.reason == "killed"
    assert result.processes_killed_at_end == 2
