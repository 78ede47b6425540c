"""`corral submit` + `corral worker` on a real PostgreSQL with the script agent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import CorralError
from corral.run.runcg import RunCgroup
from corral.store.postgres import PgFleet
from tests.integration.run.helpers import corral, corral_argv, new_id, wait_for, write_mission

pytestmark = [pytest.mark.requires_postgresql, pytest.mark.requires_sandbox]


@pytest.fixture
def run_ids() -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for rid in ids:
        cg = RunCgroup.detect(rid)
        if cg is not None and cg.exists():
            with contextlib.suppress(CorralError, OSError):
                cg.sweep()


def test_submit_then_worker_drives_it(tmp_path: Path, pg_url: str, run_ids: list[str]) -> None:
    mission = write_mission(tmp_path / "m")
    rid = new_id()
    run_ids.append(rid)
    r = corral("submit", str(mission), "--store", pg_url, "--id", rid, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = corral(
        "worker",
        "--store",
        pg_url,
        "--max-runs",
        "1",
        "--plain",
        "--work-dir",
        str(tmp_path / "w"),
        cwd=tmp_path,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    assert f"run {rid} passed" in r.stdout
    with PgFleet(pg_url) as f:
        st = f.run_store(rid)
        run, sessions = st.run(), st.sessions()
        assert run.state == "passed"
        assert [(s.n, s.state) for s in sessions] == [(1, "done"), (2, "done")]
        # Every local journal row is in the shared journal exactly once.
        import sqlite3

        local = sqlite3.connect(tmp_path / "w" / rid / "journal.sqlite")
        n_local = local.execute("SELECT count(*) FROM observations").fetchone()[0]
        local.close()
        j = f.journal()
        [(n_pg, n_distinct)] = j.execute(
            "SELECT count(*), count(DISTINCT (source, local_id)) FROM journal_observations"
            " WHERE run = %s",
            (rid,),
        )
        j.close()
        st.close()
    assert n_local > 0 and n_pg == n_distinct == n_local
    r = corral("status", "--store", pg_url, "--json", cwd=tmp_path)
    [row] = [json.loads(x) for x in r.stdout.splitlines()]
    assert (row["id"], row["state"], row["sessions"]) == (rid, "passed", 2)


def test_run_with_store_queues_and_drives_here(
    tmp_path: Path, pg_url: str, run_ids: list[str]
) -> None:
    mission = write_mission(tmp_path / "m")
    rid = new_id()
    run_ids.append(rid)
    env = dict(os.environ, CORRAL_STORE=pg_url)  # the environment's store, no --store
    r = corral(
        "run",
        str(mission),
        "--id",
        rid,
        "--plain",
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
        timeout=240,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"run {rid} passed" in r.stdout
    with PgFleet(pg_url) as f:
        [q] = f.runs()
    assert (q.run.id, q.run.state, q.takeovers) == (rid, "passed", 0)


def _events(pg_url: str, rid: str) -> list[str]:
    with PgFleet(pg_url) as f:
        st = f.run_store(rid)
        kinds = [e[2] for e in st.events()]
        st.close()
    return kinds


@pytest.mark.xfail(
    strict=False,
    reason="known gap: on one host a stalled driver resumed after a takeover closes its"
    " sandboxes, whose cgroup names (per run, not per driver) its successor now uses;"
    " fix: run cgroups named per lease epoch, recovery sweeping the older ones",
)
def test_a_stalled_worker_is_fenced_and_spares_its_successor(
    tmp_path: Path, pg_url: str, run_ids: list[str]
) -> None:
    """SIGSTOP a worker mid-session past its lease; another takes over; SIGCONT the first.

    The first must write nothing and kill nothing of its successor's: the run
    passes once, in the same two sessions as without the stall.
    """
    mission = write_mission(tmp_path / "m", agent_sleep=8)
    rid = new_id()
    run_ids.append(rid)
    assert (
        corral("submit", str(mission), "--store", pg_url, "--id", rid, cwd=tmp_path).returncode == 0
    )
    work = tmp_path / "w"
    argv = [
        "worker",
        "--store",
        pg_url,
        "--plain",
        "--lease",
        "2",
        "--idle-exit",
        "4",
        "--work-dir",
        str(work),
    ]
    first = subprocess.Popen(corral_argv(*argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with PgFleet(pg_url) as f:
            st = f.run_store(rid)
            wait_for(
                lambda: any(s.state == "running" and s.phase == "agent" for s in st.sessions()),
                120,
                "session 1 in its agent phase",
            )
            st.close()
        first.send_signal(signal.SIGSTOP)
        second = subprocess.Popen(
            corral_argv(*argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            wait_for(lambda: "takeover" in _events(pg_url, rid), 60, "the takeover")
            first.send_signal(signal.SIGCONT)
            out1, _ = first.communicate(timeout=120)
            out2, _ = second.communicate(timeout=240)
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    assert f"run {rid} lease lost".encode() in out1, out1[-2000:]
    assert f"run {rid} passed".encode() in out2, out2[-2000:]
    with PgFleet(pg_url) as f:
        st = f.run_store(rid)
        assert [(s.n, s.state) for s in st.sessions()] == [(1, "done"), (2, "done")]
        st.close()
        assert f.attempts(rid) == [(1, 1, "agent")]
    assert _events(pg_url, rid).count("run_end") == 1
