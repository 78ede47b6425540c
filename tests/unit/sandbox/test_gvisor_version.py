"""runsc's release date, asked once per binary and cached (gvisor.version)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.sandbox.gvisor import version
from corral.sandbox.gvisor.version import parse_version, release_date


@pytest.fixture
def fake_runsc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A runsc that counts its --version calls in a file."""
    monkeypatch.setattr(version, "_memo", {})
    calls = tmp_path / "calls"
    runsc = tmp_path / "runsc"
    runsc.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'runsc version 0.0~20221219.0'\n")
    runsc.chmod(0o755)
    return runsc, calls


def _calls(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_parse_version() -> None:
    assert parse_version(b"runsc version release-20240212.0\nspec: 1.1\n") == 20240212
    assert parse_version(b"runsc version 0.0~20221219.0\n") == 20221219
    assert parse_version(b"something else") is None


def test_asked_once_per_binary(fake_runsc: tuple[Path, Path], tmp_path: Path) -> None:
    runsc, calls = fake_runsc
    cache = tmp_path / "cache"
    assert release_date(str(runsc), str(cache)) == (20221219, None)
    assert release_date(str(runsc), str(cache)) == (20221219, None)
    version._memo.clear()  # a new corral process: the file answers
    assert release_date(str(runsc), str(cache)) == (20221219, None)
    assert _calls(calls) == 1
    # Another binary (here: the same path rewritten) is asked again.
    runsc.write_text(runsc.read_text().replace("20221219", "20240101"))
    os.utime(runsc, ns=(1, 1))
    assert release_date(str(runsc), str(cache)) == (20240101, None)
    assert _calls(calls) == 2


def test_an_entry_others_can_write_is_not_trusted(
    fake_runsc: tuple[Path, Path], tmp_path: Path
) -> None:
    runsc, calls = fake_runsc
    cache = tmp_path / "cache"
    release_date(str(runsc), str(cache))
    (entry,) = cache.iterdir()
    entry.write_text("20990101\n")
    entry.chmod(0o666)
    version._memo.clear()
    assert release_date(str(runsc), str(cache)) == (20221219, None)
    assert _calls(calls) == 2


def test_no_release_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(version, "_memo", {})
    runsc = tmp_path / "runsc"
    runsc.write_text("#!/bin/sh\necho hello\n")
    runsc.chmod(0o755)
    date, why = release_date(str(runsc), str(tmp_path / "cache"))
    assert date is None and why is not None and "did not name" in why
    assert release_date(str(tmp_path / "missing"), str(tmp_path))[0] is None
