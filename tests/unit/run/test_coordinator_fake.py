"""The coordinator drives sandboxes through the Backend Protocol only: checks
run on the FakeBackend, with scripted outcomes, no root and no sandbox."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from corral.broker.journal import Journal, read_rows
from corral.errors import LayerUnavailableError
from corral.run.coordinator import Coordinator, create_run
from corral.run.environments import RunLayout
from corral.run.mission import load_mission
from corral.run.progress import PlainProgress
from tests.fakes.fake_backend import FakeBackend

_MISSION = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = 1
{backend}
[[checks]]
name = "unit"
run = "true"
timeout = "7s"
+++
# a mission for the fake
"""


def _layout(tmp_path: Path, backend: str = "") -> RunLayout:
    m = tmp_path / "m"
    m.mkdir()
    (m / "scenario.yaml").write_text("sessions: []\n")
    (m / "MISSION.md").write_text(_MISSION.format(backend=backend))
    return create_run(load_mission(m / "MISSION.md"), tmp_path / "runs", run_id="tfake")


def test_checks_run_on_the_backend_given_and_journal_its_outcomes(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    fake = FakeBackend()
    coord = Coordinator(
        layout,
        PlainProgress(io.StringIO()),
        backends={"agent": fake, "product": fake, "verifier": fake},
    )
    coord._cg = SimpleNamespace(relpath="corral/run-tfake")  # type: ignore[assignment]
    # No product: no forwarder helper is needed for these checks.
    coord._journal = Journal(coord.layout.journal)
    fake.script(
        FakeBackend.result(0),
        FakeBackend.result(1),
        FakeBackend.result(124, "timeout"),
        FakeBackend.result(137, "oom", oom_kills=1),
    )
    try:
        got = [coord._run_check(1, 0, None) for _ in range(4)]
    finally:
        coord._journal.close()
    assert [(r.passed, r.reason) for r in got] == [
        (True, "passed"),
        (False, "exit 1 (exited)"),
        (False, "timed out after 7s"),
        (False, "killed by the check's memory limit"),
    ]
    assert [s.env_kind for s in fake.specs] == ["verifier"] * 4
    assert fake.parent_cgroups == ["corral/run-tfake"] * 4
    rows = [(r.env, r.target) for r in read_rows(coord.layout.journal)]
    assert rows == [
        ("verifier", "exit"),
        ("verifier", "exit"),
        ("verifier", "timeout"),
        ("verifier", "exit"),
        ("verifier", "oom_kill"),
        ("verifier", "exit"),
    ]


def test_an_unavailable_mission_backend_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _layout(tmp_path, 'backend = "gvisor"')
    monkeypatch.setitem(sys.modules, "corral.sandbox.gvisor", None)
    with pytest.raises(LayerUnavailableError) as info:
        Coordinator(layout, PlainProgress(io.StringIO()))
    assert info.value.layer == "gvisor"
