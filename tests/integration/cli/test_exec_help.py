"""`corral exec --help` looks like every other command's help; the run path stays lean."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.cli.ptyterm import plain, run_in_pty

pytestmark = [pytest.mark.timeout(60)]

SAMPLE = ("--workspace", "--memory", "--allow", "--allow-degraded", "--dry-run", "--help")


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_uses_the_typer_layout(columns: int, flag: str) -> None:
    rc, out = run_in_pty(["exec", flag], columns)
    assert rc == 0, out
    exec_lines = plain(out).splitlines()
    _, ref = run_in_pty(["stop", "--help"], columns)
    ref_lines = plain(ref).splitlines()
    assert max(len(line) for line in exec_lines) <= columns
    assert any(line.strip().startswith("Usage: corral exec [OPTIONS]") for line in exec_lines)
    # The same frame as typer's: a rounded "Options" box as wide as the terminal.
    box = next(line for line in ref_lines if line.startswith("╭─ Options"))
    assert box in exec_lines
    for option in SAMPLE:
        assert any(line.startswith(f"│ {option} ") for line in exec_lines), option
    assert not any(line.startswith("usage:") or line == "options:" for line in exec_lines)


def test_running_a_command_imports_neither_typer_nor_rich() -> None:
    code = (
        "import sys\n"
        "from corral.cli import main\n"
        "sys.argv = ['corral', 'exec', '--dry-run', '--', 'true']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', 'click')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
