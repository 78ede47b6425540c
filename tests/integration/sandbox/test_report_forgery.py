"""Issue 9 item 4: the command cannot forge the exit report (both inits).

The attack (`FORGE_SCRIPT`) rewrites the in-sandbox init through
/proc/<init>/mem and writes a fake exit line through /proc/<init>/fd/N; the
tests assert on what the host records: the real exit status and the
leftover daemon. Signals to the init must not change the outcome either.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Literal

import pytest

from corral.exec.cli import sandbox_env
from corral.sandbox import landlock
from corral.sandbox.namespace import ExecResult, NamespaceSandbox
from corral.sandbox.spec import SandboxSpec
from corral.verify.probes.report_forgery import FORGE_SCRIPT
from tests.integration.sandbox.conftest import ExecFn

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(60)]

KINDS: list[Literal["c", "python"]] = ["c", "python"]
ATTACK = "python3 -I -S forge.py 3 > forge.out 2>&1; (setsid sleep 300 &); exit 3"


def _run(
    ws: Path,
    kind: Literal["c", "python"],
    *argv: str,
    timeout: float = 30,
    degraded: frozenset[str] = frozenset(),
) -> ExecResult:
    spec = SandboxSpec(
        argv=argv,
        workspace=str(ws),
        env=tuple(sorted(sandbox_env("/home/corral", {}).items())),
        allow_degraded=degraded,
    )
    running = NamespaceSandbox(spec, init_kind=kind).start()
    try:
        return running.wait(timeout)
    finally:
        running.close()


def _forge_output(ws: Path) -> str:
    out = (ws / "forge.out").read_text()
    assert out.startswith("FORGE c") or out.startswith("FORGE python"), out
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_forged_report_does_not_change_exit_or_leftovers(
    kind: Literal["c", "python"], workspace: Path
) -> None:
    (workspace / "forge.py").write_text(FORGE_SCRIPT)
    result = _run(workspace, kind, "sh", "-c", ATTACK)
    out = _forge_output(workspace)
    assert (result.exit, result.reason) == (3, "exited"), out
    assert result.processes_killed_at_end >= 1, out
    assert "mem=denied" in out and "fd=denied" in out, out


def test_corral_exec_json_records_the_truth(corral_exec: ExecFn, workspace: Path) -> None:
    (workspace / "forge.py").write_text(FORGE_SCRIPT)
    outcome = corral_exec("sh", "-c", ATTACK)
    out = _forge_output(workspace)
    assert outcome.code == 3, (out, outcome.stderr)
    assert outcome.summary["exit"] == 3, out
    assert int(outcome.summary["processes_killed_at_end"]) >= 1, out  # type: ignore[call-overload]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_command_cannot_signal_the_init(
    kind: Literal["c", "python"], sig: signal.Signals, workspace: Path
) -> None:
    # A stopped init would never reap the command (timeout); a killed one
    # turns the status into 137. The nested domain's SCOPE_SIGNAL refuses both.
    result = _run(
        workspace, kind, "sh", "-c", f"kill -{sig.name[3:]} $PPID; echo $? > rc; exit 3", timeout=20
    )
    assert (result.exit, result.reason) == (3, "exited")
    assert (workspace / "rc").read_text().strip() != "0"


@pytest.mark.parametrize("kind", KINDS)
def test_undumpable_init_without_landlock(
    kind: Literal["c", "python"], workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Landlock off (degraded): only PR_SET_DUMPABLE 0 stands between the
    # command and the init's memory and descriptors.
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)
    (workspace / "forge.py").write_text(FORGE_SCRIPT)
    result = _run(workspace, kind, "sh", "-c", ATTACK, degraded=frozenset({"landlock"}))
    out = _forge_output(workspace)
    assert str(result.layers["landlock"]).startswith("degraded")
    assert (result.exit, result.reason) == (3, "exited"), out
    assert result.processes_killed_at_end >= 1, out
    assert "mem=denied" in out and "fd=denied" in out, out
