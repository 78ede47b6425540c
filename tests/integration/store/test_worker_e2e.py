"""`corral submit` + `corral worker` on a real PostgreSQL with the script agent."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import CorralError
from corral.run.runcg import RunCgroup
from corral.store.postgres import PgFleet
from tests.integration.run.helpers import corral, new_id, write_mission

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
