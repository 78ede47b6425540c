"""Every run command finds runs the same way; a bad `--runs-dir` is one line, exit 2 (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.cli.ptyterm import run_piped
from tests.integration.cli.test_log_layout import _fill

pytestmark = [pytest.mark.timeout(60)]

COMMANDS = (("status",), ("stop", "x"), ("resume", "x"), ("pause", "x"), ("top", "--once"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    run = tmp_path / ".corral" / "runs" / "demo-20261201-1"
    run.mkdir(parents=True)
    (run / "state.sqlite").touch()
    _fill(run / "journal.sqlite")
    (tmp_path / "src" / "deep").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize("cmd", [*COMMANDS, ("log", "x")], ids=lambda c: c[0])
@pytest.mark.parametrize("kind", ["file", "missing"])
def test_bad_runs_dir_is_one_line_exit_2(tmp_path: Path, cmd: tuple[str, ...], kind: str) -> None:
    bad = tmp_path / "runs"
    if kind == "file":
        bad.write_text("not a directory")
    result = run_piped([*cmd, "--runs-dir", str(bad)], cwd=str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    what = "is not a directory" if kind == "file" else "does not exist"
    assert len(lines) == 1 and what in lines[0] and str(bad) in lines[0], result.stderr


def test_log_by_run_id_from_a_subdirectory(project: Path) -> None:
    result = run_piped(["log", "demo"], cwd=str(project / "src" / "deep"))
    assert result.returncode == 0, result.stderr
    assert "target=evil.test:443" in result.stdout


def test_log_by_run_id_with_runs_dir_and_environment(project: Path, tmp_path: Path) -> None:
    runs = project / ".corral" / "runs"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    by_flag = run_piped(["log", "demo-2026", "--runs-dir", str(runs)], cwd=str(elsewhere))
    assert by_flag.returncode == 0 and "target=evil.test:443" in by_flag.stdout, by_flag.stderr
    by_env = run_piped(["log", "demo"], cwd=str(elsewhere), env={"CORRAL_RUNS_DIR": str(runs)})
    assert by_env.returncode == 0 and "target=evil.test:443" in by_env.stdout, by_env.stderr
    # The variable beats the project's own directory.
    empty = tmp_path / "empty"
    empty.mkdir()
    shadowed = run_piped(["log", "demo"], cwd=str(project), env={"CORRAL_RUNS_DIR": str(empty)})
    assert shadowed.returncode == 2 and "no run 'demo'" in shadowed.stderr


def test_status_finds_the_project_runs_from_a_subdirectory(project: Path) -> None:
    result = run_piped(["stop", "nosuch"], cwd=str(project / "src" / "deep"))
    assert result.returncode == 2
    assert f"no run 'nosuch' in {project / '.corral' / 'runs'}" in result.stderr
