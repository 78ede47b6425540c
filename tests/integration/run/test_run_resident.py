"""`corral run`'s sessions share one resident broker of the run, inside the run cgroup.

A broker started cold per session spends 0.35-0.7 s importing before the
agent's first request; the run's resident serves every session on that
session's own listener and journal identity. It lives in the run's helpers
cgroup (so pause freezes it, the run's caps count it, the run's teardown
kills it) and listens on a socket in the host-private run directory, never
the per-user resident of `corral exec`. Its death ending the session (fail
closed) is `test_recovery.py::test_sigkill_broker_ends_the_session_and_the_next_gets_a_new_one`.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.integration.run.helpers import (
    alive,
    corral,
    env_with,
    in_phase,
    new_id,
    run_cgroup,
    sessions,
    start_corral,
    wait_for,
    write_mission,
)

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(90)]


def _broker_starts(journal: Path) -> list[tuple[str, dict[str, object]]]:
    conn = sqlite3.connect(f"{journal.as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT session, detail FROM observations WHERE reason = 'broker started'"
        ).fetchall()
    finally:
        conn.close()
    return [(str(s), json.loads(d)) for s, d in rows]


def test_sessions_share_the_runs_resident_in_the_run_cgroup(tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m", agent_sleep=3)
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for(
            lambda: in_phase(run_dir, 1, "agent") and sessions(run_dir)[0].broker_pid is not None,
            40,
            "session 1's broker",
        )
        broker = sessions(run_dir)[0].broker_pid
        assert broker is not None and alive(broker)
        with open(f"/proc/{broker}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        assert b"resident" in argv
        assert argv[argv.index(b"--socket") + 1] == bytes(run_dir / "broker" / "resident.sock")
        wait_for(lambda: broker in run_cgroup(rid).pids(), 10, "the broker in the run cgroup")
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ss = sessions(run_dir)
    assert len(ss) >= 2 and ss[-1].checks_passed == ss[-1].checks_total
    # One broker process served both sessions: the second started none.
    assert [s.broker_pid for s in ss] == [broker] * len(ss)
    starts = _broker_starts(run_dir / "journal.sqlite")
    assert [s for s, _ in starts] == [str(s.n) for s in ss]
    assert all(d.get("resident") is True for _, d in starts)
    # The run's teardown took it with the run cgroup.
    wait_for(lambda: not alive(broker), 10, "the resident's end with the run")
    assert not run_cgroup(rid).exists()


def test_cold_brokers_on_request(tmp_path: Path) -> None:
    """`CORRAL_BROKER=cold` keeps a broker process per session."""
    mission = write_mission(tmp_path / "m")
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    result = corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path, timeout=80, env=env_with(CORRAL_BROKER="cold"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    ss = sessions(run_dir)
    pids = [s.broker_pid for s in ss]
    assert len(ss) >= 2 and None not in pids and len(set(pids)) == len(pids)
    assert all("resident" not in d for _, d in _broker_starts(run_dir / "journal.sqlite"))
