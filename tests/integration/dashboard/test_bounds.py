"""Whatever a run wrote, one dashboard page stays small: every read is capped first."""

from __future__ import annotations

import http.client
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.broker.actions import Observation
from corral.broker.journal import _INSERT_OBS, observation_row
from corral.dashboard import data
from corral.hostgit import TrustedRepo
from corral.run.environments import RunLayout
from tests.integration.dashboard.hostile import hostile_run

pytestmark = pytest.mark.timeout(60)

BIG = 2 << 20


def _bloat(root: Path) -> None:
    """Session 2 adds 4 MiB of text files (40); the state and journal get 2 MiB values."""
    for i in range(40):
        (root / "workspace" / f"f{i}.txt").write_bytes(b"line\n" * 20_000)
    head = TrustedRepo(root / "git", root / "workspace").commit_all("session 2")
    conn = sqlite3.connect(root / "state.sqlite")
    with conn:
        conn.execute(
            "INSERT INTO sessions (n, state, phase, started, commit_sha, summary) VALUES"
            " (2, 'done', 'agent', 'now', ?, ?)",
            (head, "s" * BIG),
        )
        conn.execute(
            "INSERT INTO checks (session, name, passed, reason, duration_s, output) VALUES"
            " (2, ?, 0, ?, 0, ?)",
            ("n" * BIG, "r" * BIG, "o" * BIG),
        )
        conn.execute("UPDATE run SET end_reason = ?", ("e" * BIG,))
    conn.close()
    (root / "sessions" / "session-2").mkdir(parents=True)
    (root / "sessions" / "session-2" / "prompt.md").write_bytes(b"p" * BIG)
    row = observation_row(
        Observation(
            run="hostile",
            env="agent",
            kind="http_request",
            target="t" * 20_000,
            decision="deny",
            rule="r" * 10_000,
            reason="w" * 20_000,
        )
    )
    conn = sqlite3.connect(root / "journal.sqlite")
    with conn:
        conn.executemany(_INSERT_OBS, [row] * 500)
    conn.close()


def test_page_is_bounded(tmp_path: Path, dashboard: Any) -> None:
    runs = tmp_path / "runs"
    root = hostile_run(runs)
    _bloat(root)
    layout = RunLayout(root)
    sessions = data.session_views(layout)
    diff = data.session_diff(layout, sessions, 2)
    assert len(diff) < data.MAX_DIFF + 200 and diff.endswith(f"(diff cut at {data.MAX_DIFF} bytes)")
    assert len(data.journal_rows(layout)) == data.MAX_JOURNAL_ROWS
    d = dashboard(runs)
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    conn.request("GET", "/run/hostile", headers={"Cookie": f"corral_dash={d.token}"})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 200
    # 2 MiB values times a dozen fields, 500 rows of 50 kB: the page stays under 1.5 MB.
    assert len(body) < 1_500_000, len(body)
    assert b"chars, cut" in body and b"diff cut at" in body and b"(cut)" in body
