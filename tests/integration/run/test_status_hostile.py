"""`corral status` on a run whose end reason quotes a hostile agent (issue 9, item 7).

The run's state is written the way the coordinator writes it after an agent
failed with forged error text; then the real `corral status` runs on the host
as a terminal would see it (FORCE_COLOR) and in a pipe, and `--json`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from corral.run.store import Store
from tests.integration.run.helpers import corral

HOSTILE = (
    "agent failed: [/x] [link=file:///etc/passwd]x[/link] \x1b]8;;file:///etc/passwd\x1b\\osc"
    "\x1b[2J\r\u202e\x9b31m " + "A" * 100_000
)


def _run(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    run_dir = runs / "hostile"
    run_dir.mkdir(parents=True)
    with Store(run_dir / "state.sqlite") as store:
        store.create_run(
            "hostile",
            mission="m",
            agent="script",
            provider="synthetic",
            max_sessions=1,
            memory_cap=1 << 30,
        )
        store.begin_session(1)
        store.end_session(1, state="done", end_reason=HOSTILE[:214], run_peak_memory=0)
        store.update_run(state="failed", end_reason=HOSTILE)
    return runs


def _status(tmp_path: Path, *args: str, color: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["COLUMNS"] = "200"
    if color:
        env["FORCE_COLOR"] = "1"
    proc = corral("status", *args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_status_shows_the_end_reason_as_data(tmp_path: Path) -> None:
    _run(tmp_path)
    for color in (False, True):
        out = _status(tmp_path, color=color)
        assert re.search(r"\x1b(?!\[[0-9;]*m)", out) is None, "a non-SGR escape was printed"
        for raw in ("\r", "\u202e", "\x9b"):
            assert raw not in out
        plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
        # A terminal gets the table at COLUMNS; a pipe one bounded line a run (issue 14).
        assert max(len(line) for line in plain.splitlines()) <= (200 if color else 400)
        flat = "".join(line.strip("│ ") for line in plain.splitlines())
        assert "[/x][link=file:///etc/passwd]x[/link]" in flat.replace(" ", "")
        assert "\\x1b]8;;" in flat and "chars)" in flat
        assert len(out) < 5000


def test_status_json_keeps_the_raw_reason(tmp_path: Path) -> None:
    _run(tmp_path)
    out = _status(tmp_path, "--json", color=True)
    assert out.isascii()
    [row] = [json.loads(line) for line in out.splitlines()]
    assert row["end_reason"] == HOSTILE
