"""Whatever a run wrote, one dashboard page stays small: every read is capped first."""

from __future__ import annotations

import http.client
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.broker.actions import Observation
from corral.broker.journal import Journal
from corral.dashboard import data
from corral.hostgit import TrustedRepo
from corral.run.environments import RunLayout
from tests.integration.dashboard.hostile import hostile_run

pytestmark = pytest.mark.timeout(60)

BIG = 8 << 20


def _bloat(root: Path) -> None:
    """Session 2 adds 4 MiB of text files; the state and journal get 8 MiB values."""
    for i in range(400):
        (root / "workspace" / f"f{i}.txt").write_bytes(b"line\n" * 2000)
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
    with Journal(root / "journal.sqlite") as j:
        for _ in range(2000):
            j.append(
                Observation(
                    run="hostile",
                    env="agent",
                    kind="http_request",
                    target="t" * 100_000,
                    decision="deny",
                    rule="r" * 10_000,
                    reason="w" * 100_000,
                )
            )


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
    # 8 MiB values times a dozen fields, 2000 rows of 200 kB: the page is a few MiB at most.
    assert len(body) < 3 << 20, len(body)
    assert b"chars, cut" in body and b"diff cut at" in body and b"(cut)" in body
