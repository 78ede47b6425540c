"""`corral run --provider …` on a mission without a scenario: refused cleanly, or accepted.

The CLI is run as a subprocess (exit code and stderr as a user sees them);
every refusal must leave no run directory behind (`corral status` stays empty).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.run.mission import load_mission

MISSION = """+++
agent = "script"
provider = "anthropic"
max_sessions = 1
[[checks]]
name = "file"
run = "test -f done.txt"
+++
Write done.txt.
"""

SYNTHETIC_DEFAULT = MISSION.replace('provider = "anthropic"\n', "")


def _corral(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        cwd=tmp_path,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _mission(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "MISSION.md"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "args",
    [
        ["--provider", "anthropic"],
        ["--provider", "openai-compatible:http://127.0.0.1:9/v1", "--provider-key", "env:NOPE_KEY"],
        [
            "--provider",
            "anthropic-compatible:http://127.0.0.1:9",
            "--provider-key",
            "file:/nonexistent/k",
        ],
    ],
)
def test_missing_key_is_exit_2_one_line_and_no_run(tmp_path: Path, args: list[str]) -> None:
    _mission(tmp_path, SYNTHETIC_DEFAULT)
    runs = tmp_path / "runs"
    done = _corral(tmp_path, "run", "MISSION.md", "--runs-dir", str(runs), *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("corral run: ")
    assert "Error(" not in lines[0]
    assert "scenario" not in lines[0]
    assert not runs.exists() or [p.name for p in runs.iterdir() if not p.name.startswith(".")] == []
    status = _corral(tmp_path, "status", "--runs-dir", str(runs), "--json")
    assert status.stdout.strip() == ""


def test_bad_provider_url_is_exit_2(tmp_path: Path) -> None:
    _mission(tmp_path, SYNTHETIC_DEFAULT)
    done = _corral(tmp_path, "run", "MISSION.md", "--provider", "openai-compatible:ftp://x")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_override_applies_before_the_default_scenario_is_checked(tmp_path: Path) -> None:
    path = _mission(tmp_path, SYNTHETIC_DEFAULT)
    with pytest.raises(Exception, match="scenario"):
        load_mission(path)
    m = load_mission(path, "anthropic")
    assert m.provider.kind == "anthropic"
    assert m.scenario_path is None
    m = load_mission(path, "openai-compatible:http://127.0.0.1:8000/v1/", "env:LOCAL_KEY")
    assert (m.provider.kind, m.provider.url, m.provider.key) == (
        "openai-compatible",
        "http://127.0.0.1:8000",
        "env:LOCAL_KEY",
    )


def test_mission_provider_key_stays_with_its_own_provider(tmp_path: Path) -> None:
    text = MISSION.replace(
        'provider = "anthropic"',
        'provider = "anthropic-compatible:http://127.0.0.1:4000"\nprovider_key = "env:GW_KEY"',
    )
    path = _mission(tmp_path, text)
    assert load_mission(path).provider.key == "env:GW_KEY"
    # Another server named on the command line does not get the file's key.
    assert load_mission(path, "anthropic-compatible:http://10.0.0.9:4000").provider.key is None
    with pytest.raises(Exception, match="provider_key"):
        load_mission(
            _mission(
                tmp_path, MISSION.replace('"anthropic"', '"anthropic"\nprovider_key = "env:X"')
            )
        )


def test_key_present_creates_the_run(tmp_path: Path) -> None:
    """Control: with the key set the same command gets past validation and creates a run."""
    from corral.run.coordinator import RunConfig, create_run
    from corral.run.environments import RunLayout

    path = _mission(tmp_path, SYNTHETIC_DEFAULT)
    m = load_mission(path, "anthropic-compatible:http://127.0.0.1:9", "env:PROV_TEST_KEY")
    os.environ["PROV_TEST_KEY"] = "k-123"
    try:
        layout = create_run(m, tmp_path / "runs", run_id="r1")
    finally:
        del os.environ["PROV_TEST_KEY"]
    cfg = RunConfig.from_json(RunLayout(layout.root).config.read_text(encoding="utf-8"))
    assert (cfg.provider, cfg.provider_key) == (
        "anthropic-compatible:http://127.0.0.1:9",
        "env:PROV_TEST_KEY",
    )
    assert "k-123" not in RunLayout(layout.root).config.read_text(encoding="utf-8")


def test_missing_key_with_a_scenario_present_leaves_no_failed_run(tmp_path: Path) -> None:
    """The mission's own scenario exists: the refusal still comes before the run is made."""
    _mission(tmp_path, SYNTHETIC_DEFAULT)
    (tmp_path / "scenario.yaml").write_text("turns: []\n", encoding="utf-8")
    runs = tmp_path / "runs"
    done = _corral(
        tmp_path, "run", "MISSION.md", "--runs-dir", str(runs), "--provider", "anthropic"
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == (
        "corral run: --provider anthropic needs $ANTHROPIC_API_KEY in corral's environment"
    )
    status = _corral(tmp_path, "status", "--runs-dir", str(runs), "--json")
    assert status.stdout.strip() == ""


def test_resume_without_the_key_is_exit_2_and_the_run_stays_resumable(tmp_path: Path) -> None:
    from corral.run.coordinator import create_run
    from corral.run.store import Store

    path = _mission(tmp_path, SYNTHETIC_DEFAULT)
    m = load_mission(path, "anthropic-compatible:http://127.0.0.1:9", "env:PROV_RESUME_KEY")
    os.environ["PROV_RESUME_KEY"] = "k-456"
    try:
        layout = create_run(m, tmp_path / "runs", run_id="r2")
    finally:
        del os.environ["PROV_RESUME_KEY"]
    done = _corral(tmp_path, "resume", "r2", "--runs-dir", str(tmp_path / "runs"), "--plain")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == (
        "corral resume: provider key env:PROV_RESUME_KEY: "
        "$PROV_RESUME_KEY is not set in corral's environment"
    )
    with Store(layout.state, readonly=True) as store:
        assert store.run().state != "failed"
