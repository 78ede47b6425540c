"""`corral exec` bad limits: one clear line, exit 2 (issue 14)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.cli.ptyterm import run_piped

pytestmark = [pytest.mark.timeout(60)]


def _exec(tmp_path: Path, *opts: str) -> tuple[int, list[str]]:
    result = run_piped(["exec", *opts, "--dry-run", "--", "true"], cwd=str(tmp_path))
    return result.returncode, result.stderr.strip().splitlines()


@pytest.mark.parametrize("value", ["-5M", "-1"])
@pytest.mark.parametrize("flag", ["--memory", "--disk"])
def test_negative_size_is_named(tmp_path: Path, flag: str, value: str) -> None:
    rc, err = _exec(tmp_path, flag, value)
    assert rc == 2
    assert err == [f"corral exec: size must be positive: {value!r}"]


def test_more_cpus_than_the_host_has_is_refused_with_the_count(tmp_path: Path) -> None:
    have = len(os.sched_getaffinity(0))
    rc, err = _exec(tmp_path, "--cpus", str(have + 1))
    assert rc == 2
    assert err == [f"corral exec: CPU count {have + 1} is more than the {have} CPUs this host has"]
    rc, _ = _exec(tmp_path, "--cpus", str(have))
    assert rc == 0


def test_a_dash_value_does_not_swallow_a_real_option(tmp_path: Path) -> None:
    # `--memory --cpus 1`: the value is missing, not '--cpus'.
    rc, err = _exec(tmp_path, "--memory", "--cpus", "1")
    assert rc == 2 and len(err) == 1 and "--memory" in err[0] and "expected one argument" in err[0]
