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
from corral.store.worker import run_dir
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


def test_submit_then_worker_drives_it(
    tmp_path: Path, pg_worker: tuple[str, str], run_ids: list[str]
) -> None:
    """As the worker role of `corral store-init`: its grants are all a worker needs."""
    pg_url = pg_worker[1]
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

        local = sqlite3.connect(run_dir(tmp_path / "w", rid, 1) / "journal.sqlite")
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


def _events(pg_url: str, rid: str) -> list[tuple[str, dict[str, object]]]:
    with PgFleet(pg_url) as f:
        st = f.run_store(rid)
        out = [(e[2], e[3]) for e in st.events()]
        st.close()
    return out


def _kinds(pg_url: str, rid: str) -> list[str]:
    return [k for k, _ in _events(pg_url, rid)]


def _successor_in_session(pg_url: str, rid: str) -> bool:
    kinds = _kinds(pg_url, rid)
    return "takeover" in kinds and "session_start" in kinds[kinds.index("takeover") :]


def test_a_stalled_worker_is_fenced_and_spares_its_successor(
    tmp_path: Path, pg_url: str, run_ids: list[str]
) -> None:
    """SIGSTOP a worker mid-session past its lease; another takes over on the same host
    (same --work-dir); with the successor frozen mid-session (SIGSTOP), SIGCONT the first
    and let it run to its exit. It must write nothing and kill nothing of its successor's:
    the run passes once, in the same two sessions as without the stall.
    """
    mission = write_mission(tmp_path / "m", agent_sleep=8)
    rid = new_id()
    run_ids.append(rid)
    assert (
        corral("submit", str(mission), "--store", pg_url, "--id", rid, cwd=tmp_path).returncode == 0
    )
    work = tmp_path / "w"

    def argv(lease: str) -> list[str]:
        return corral_argv(
            "worker", "--store", pg_url, "--plain", "--lease", lease, "--idle-exit", "4",
            "--work-dir", str(work),
        )  # fmt: skip

    first = subprocess.Popen(argv("2"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    second: subprocess.Popen[bytes] | None = None
    try:
        with PgFleet(pg_url) as f:
            st = f.run_store(rid)
            wait_for(
                lambda: any(s.state == "running" and s.phase == "agent" for s in st.sessions()),
                120,
                "session 1 in its agent phase",
            )
            st.close()
        old = RunCgroup.detect(rid, 1)
        assert old is not None
        wait_for(lambda: bool(old.pids()), 60, "the first driver's sandbox in its epoch's cgroup")
        first.send_signal(signal.SIGSTOP)
        # The successor's lease outlives its own freeze below: nobody else may claim.
        second = subprocess.Popen(argv("120"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: _successor_in_session(pg_url, rid), 120, "the successor's session")
        [epoch] = [d["epoch"] for k, d in _events(pg_url, rid) if k == "takeover"]
        assert epoch == 2
        # The takeover swept the stalled driver's sandboxes and brokers on this host.
        assert not old.exists() and not old.pids()
        new = RunCgroup.detect(rid, 2)
        assert new is not None
        wait_for(lambda: bool(new.pids()), 60, "the successor's sandbox")
        second.send_signal(signal.SIGSTOP)
        first.send_signal(signal.SIGCONT)
        out1, _ = first.communicate(timeout=120)
        # The first ran its whole wake-up and exit while the successor stood still:
        # the successor's sandbox, broker and run directory are untouched.
        assert new.exists() and new.pids(), "the stalled driver killed its successor's sandbox"
        assert run_dir(work, rid, 2).joinpath("journal.source").is_file()
        second.send_signal(signal.SIGCONT)
        out2, _ = second.communicate(timeout=240)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
    assert f"run {rid} lease lost".encode() in out1, out1[-2000:]
    assert f"run {rid} passed".encode() in out2, out2[-2000:]
    with PgFleet(pg_url) as f:
        st = f.run_store(rid)
        assert [(s.n, s.state) for s in st.sessions()] == [(1, "done"), (2, "done")]
        st.close()
        assert f.attempts(rid) == [(1, 1, "agent")]
    assert _kinds(pg_url, rid).count("run_end") == 1
    cg = RunCgroup.detect(rid)
    assert cg is not None and not cg.exists(), "the final driver removes the run's cgroups"
