"""`scripts/install-venv.sh` (what `make venv` runs) prints its phases and each package.

A stub interpreter stands in for python: it "creates" the venv and "installs"
by printing pip's lines, so the test neither downloads nor installs anything.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "install-venv.sh"

STUB = """#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
case "$*" in
  *"-e .[dev]"*)
    echo "Obtaining file:///x"
    echo "Collecting typer>=0.12"
    echo "  Downloading typer-0.12.0.whl"
    echo "Collecting rich>=13"
    [ -n "$FAIL" ] && { echo "ERROR: no matching distribution for rich" ; exit 1; }
    echo "Successfully installed rich typer";;
esac
exit 0
"""


def _run(tmp_path: Path, fail: bool = False) -> subprocess.CompletedProcess[str]:
    stub = tmp_path / "python-stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", **({"FAIL": "1"} if fail else {})}
    return subprocess.run(
        ["bash", str(SCRIPT), str(stub), str(tmp_path / "venv")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
        check=False,
    )


def test_phases_and_packages_are_printed(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [x.split("]")[0] for x in lines if x.startswith("venv: [")] == [
        "venv: [1/3",
        "venv: [2/3",
        "venv: [3/3",
    ]
    assert "  collecting typer>=0.12" in lines and "  collecting rich>=13" in lines
    assert lines[-1].startswith("venv: ready in ") and lines[-1].endswith("(2 packages)")


def test_a_failed_install_shows_pip_output_and_fails(tmp_path: Path) -> None:
    out = _run(tmp_path, fail=True)
    assert out.returncode == 1
    assert "ERROR: no matching distribution for rich" in out.stderr
    assert "venv: pip install failed" in out.stderr
