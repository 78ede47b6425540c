"""The one runs-directory resolver: flag, $CORRAL_RUNS_DIR, upward search (pure-ish, tmp dirs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import UsageError
from corral.run.runsdir import resolve_runs_dir


def test_found_upward_from_a_subdirectory(tmp_path: Path) -> None:
    runs = tmp_path / ".corral" / "runs"
    runs.mkdir(parents=True)
    deep = tmp_path / "src" / "pkg"
    deep.mkdir(parents=True)
    assert resolve_runs_dir(None, env={}, cwd=deep) == runs


def test_default_is_the_working_directory_when_none_is_found(tmp_path: Path) -> None:
    assert resolve_runs_dir(None, env={}, cwd=tmp_path) == tmp_path / ".corral" / "runs"


def test_environment_overrides_the_search_and_the_flag_overrides_both(tmp_path: Path) -> None:
    (tmp_path / ".corral" / "runs").mkdir(parents=True)
    other, flag = tmp_path / "other", tmp_path / "flag"
    other.mkdir()
    flag.mkdir()
    env = {"CORRAL_RUNS_DIR": str(other)}
    assert resolve_runs_dir(None, env=env, cwd=tmp_path) == other
    assert resolve_runs_dir(flag, env=env, cwd=tmp_path) == flag


@pytest.mark.parametrize("create", [False, True])
def test_a_file_is_refused_by_name(tmp_path: Path, create: bool) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UsageError, match=r"^--runs-dir .*/f is not a directory$"):
        resolve_runs_dir(f, env={}, cwd=tmp_path, create=create)
    with pytest.raises(UsageError, match=r"^CORRAL_RUNS_DIR .*/f is not a directory$"):
        resolve_runs_dir(None, env={"CORRAL_RUNS_DIR": str(f)}, cwd=tmp_path, create=create)


def test_missing_is_refused_unless_run_creates_it_under_an_existing_parent(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        resolve_runs_dir(tmp_path / "nope", env={}, cwd=tmp_path)
    assert resolve_runs_dir(tmp_path / "new", env={}, cwd=tmp_path, create=True) == tmp_path / "new"
    with pytest.raises(UsageError, match="does not exist"):
        resolve_runs_dir(tmp_path / "a" / "b", env={}, cwd=tmp_path, create=True)
