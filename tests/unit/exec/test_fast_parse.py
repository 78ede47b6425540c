"""`corral exec`'s argparse-free parse agrees with argparse wherever it answers (issue 13)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from corral.exec.cli import _fast_parse, _parse_slow, parse_args

ACCEPTED = [
    [],
    ["--workspace", "/w"],
    ["--workspace=/w", "--json", "--dry-run"],
    ["--env", "agent", "--memory", "512M", "--disk=1G", "--cpus", "0.5", "--pids", "64"],
    ["--timeout", "10m", "--allow", "pypi.org", "--allow=github.com:443", "--allow", "x"],
    ["--ro", "/a", "--rw", "/b", "--ro=/c", "--allow-unix", "/s.sock"],
    ["--backend", "gvisor", "--journal", "/j.sqlite", "--config", "/c.toml"],
    ["--run", "r1", "--session", "s1", "--setenv", "A=B", "--setenv=C=D=E"],
    ["--allow-degraded", "cgroup", "--allow-degraded=landlock", "--unprotect", ".git"],
    ["--memory=", "--workspace", "/a", "--workspace", "/b"],  # empty value; last one wins
    ["--memory=-5M"],  # an inline value may start with '-'
    ["--host-service", "db=5432", "--json", "--json"],
]

DEFERRED = [
    ["--work", "/w"],  # an abbreviation: argparse's call
    ["--memory", "-5M"],  # a value that looks like an option
    ["--env", "bogus"],  # not a choice: argparse reports it
    ["--allow-degraded", "init"],
    ["--json=yes"],
    ["--memory"],
    ["-h"],
    ["--help"],
    ["--bogus"],
    ["/w"],
]


@pytest.mark.parametrize("opts", ACCEPTED)
def test_fast_parse_equals_argparse(opts: list[str]) -> None:
    fast = _fast_parse(opts)
    assert fast is not None
    assert fast == _parse_slow([*opts, "--", "true"])[0]


@pytest.mark.parametrize("opts", DEFERRED)
def test_fast_parse_defers(opts: list[str]) -> None:
    assert _fast_parse(opts) is None


def test_deferred_forms_still_get_argparse_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--env", "bogus", "--", "true"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_no_command_after_dashes_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--json", "--"])
    assert exc.value.code == 2
    assert "no command given" in capsys.readouterr().err


def test_fast_path_does_not_import_argparse() -> None:
    code = (
        "import sys; from corral.exec.cli import parse_args; "
        "ns, cmd = parse_args(['--workspace', '/w', '--json', '--', 'true']); "
        "print('argparse' in sys.modules, 'shutil' in sys.modules, cmd)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False ['true']"
