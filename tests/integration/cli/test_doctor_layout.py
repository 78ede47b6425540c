"""`corral doctor` is compact at 80 columns: a working layer takes one line (issue 14)."""

from __future__ import annotations

import json

import pytest

from tests.integration.cli.ptyterm import plain, run_in_pty, run_piped

pytestmark = [pytest.mark.timeout(60)]


@pytest.mark.parametrize("columns", [80, 200])
def test_one_line_a_working_layer(columns: int) -> None:
    layers = json.loads(run_piped(["doctor", "--json", "--no-smoke"]).stdout)["layers"]
    rc, out = run_in_pty(["doctor", "--no-smoke"], columns)
    lines = [line.rstrip() for line in plain(out).splitlines() if line.strip()]
    assert rc in (0, 1), out
    assert max(len(line) for line in lines) <= columns
    working = [x["layer"] for x in layers if x["available"]]
    missing = [x["layer"] for x in layers if not x["available"]]
    for name in working:
        starts = [line for line in lines if line.startswith(f"ok      {name} ")]
        assert len(starts) == 1, (name, out)
    for name in missing:
        assert any(line.startswith(f"MISSING {name} ") for line in lines), (name, out)
    # Each missing layer: its reason and what to do, a few lines at 80 columns; one verdict line.
    assert len(lines) <= len(working) + 5 * len(missing) + 1, out


def test_piped_prints_every_reason_whole() -> None:
    layers = json.loads(run_piped(["doctor", "--json", "--no-smoke"]).stdout)["layers"]
    out = run_piped(["doctor", "--no-smoke"]).stdout
    assert "\x1b" not in out and "┃" not in out
    for x in layers:
        assert x["reason"] in out, x["layer"]
