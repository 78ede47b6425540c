"""A fleet run's journal survives the loss of the host that wrote it.

The brokers of a run driven from PostgreSQL commit every row to the store
before they acknowledge it (corral.broker.pgjournal): SIGKILL the writer at
any point, delete its run directory (the host is gone), and every row it
acknowledged is in the shared journal. The control with the plain SQLite
journal loses them all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.broker.pgjournal import TeeJournal
from corral.errors import CorralError
from corral.run.runcg import RunCgroup
from corral.store.postgres import PgFleet
from tests.integration.run.helpers import corral, corral_argv, new_id, wait_for, write_mission

pytestmark = [pytest.mark.requires_postgresql]

WRITER = Path(__file__).with_name("journal_writer.py")


@pytest.fixture
def run_ids() -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for rid in ids:
        cg = RunCgroup.detect(rid)
        if cg is not None and cg.exists():
            with contextlib.suppress(CorralError, OSError):
                cg.sweep()


def _rows(pg_url: str, run: str) -> list[tuple[int, str]]:
    with PgFleet(pg_url) as f:
        j = f.journal()
        rows = j.execute(
            "SELECT local_id, target FROM journal_observations WHERE run = %s ORDER BY local_id",
            (run,),
        )
        outcomes = j.execute(
            "SELECT count(*) FROM journal_outcomes o JOIN journal_observations b"
            " ON b.id = o.observation WHERE b.run = %s",
            (run,),
        )
        j.close()
    assert outcomes[0][0] <= len(rows)
    return [(int(a), str(b)) for a, b in rows]


def _write_then_lose_the_host(tmp_path: Path, url: str, run: str, kill_after: int) -> int:
    """Run the writer, SIGKILL it after `kill_after` acknowledgements, delete its journal."""
    local = tmp_path / run / "journal.sqlite"
    local.parent.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[3] / "src"))
    argv = [sys.executable, str(WRITER), str(local), url, f"host-a:{run}", run, "100000"]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, cwd=Path(__file__).parents[3])
    assert child.stdout is not None
    acked = 0
    try:
        while acked < kill_after:
            line = child.stdout.readline()
            assert line, "the writer died early"
            acked = int(line) + 1
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    shutil.rmtree(local.parent)  # the host is lost with its run directory
    return acked


def test_acknowledged_rows_survive_sigkill_and_host_loss(tmp_path: Path, pg_url: str) -> None:
    with PgFleet(pg_url):
        pass  # migrated
    acked = _write_then_lose_the_host(tmp_path, pg_url, "tee", 300)
    rows = _rows(pg_url, "tee")
    # Every acknowledged row, in order, none twice; at most the one in flight beyond.
    assert [t for _, t in rows[:acked]] == [f"h{i}.example:443" for i in range(acked)]
    assert len(rows) in (acked, acked + 1)
    assert len({i for i, _ in rows}) == len(rows)


def test_control_plain_sqlite_journal_loses_them(tmp_path: Path, pg_url: str) -> None:
    with PgFleet(pg_url):
        pass
    acked = _write_then_lose_the_host(tmp_path, "-", "plain", 300)
    assert acked == 300 and _rows(pg_url, "plain") == []


def test_an_unreachable_shared_journal_refuses(tmp_path: Path) -> None:
    from corral.errors import JournalError

    with pytest.raises(JournalError, match="cannot reach the shared journal"):
        TeeJournal(tmp_path / "j.sqlite", f"postgresql:///x?host={tmp_path}/none", "s")


def test_cost_per_observation(tmp_path: Path, pg_url: str) -> None:
    """Measured, not asserted (a loaded host decides nothing): printed for docs/scale-out.md."""
    from corral.broker.actions import Identity, NetConnect, Observation
    from corral.broker.journal import Journal

    with PgFleet(pg_url):
        pass
    who = Identity(run="cost", session="1", env="agent")
    obs = Observation.of(
        NetConnect(host="x.example", port=443), who, decision="allow", rule="r", reason="t"
    )
    n = 300
    out = {}
    for name, j in (
        ("sqlite", Journal(tmp_path / "a.sqlite")),
        ("tee", TeeJournal(tmp_path / "b.sqlite", pg_url, "cost:b")),
    ):
        t = time.perf_counter()
        for _ in range(n):
            j.append(obs)
        out[name] = (time.perf_counter() - t) / n * 1e6
        j.close()
    sys.stderr.write(f"journal cost per observation (us): {out}\n")
    assert len(_rows(pg_url, "cost")) == n


@pytest.mark.requires_sandbox
def test_a_lost_workers_session_rows_are_in_the_store(
    tmp_path: Path, pg_url: str, run_ids: list[str]
) -> None:
    """A real worker, SIGKILLed mid-session with its whole host state (processes, run
    directory) destroyed: the broker's rows of the unfinished session are in the store."""
    mission = write_mission(tmp_path / "m", agent_sleep=30)
    rid = new_id()
    run_ids.append(rid)
    assert (
        corral("submit", str(mission), "--store", pg_url, "--id", rid, cwd=tmp_path).returncode == 0
    )
    work = tmp_path / "w"
    argv = corral_argv(
        "worker", "--store", pg_url, "--plain", "--max-runs", "1", "--work-dir", str(work)
    )
    w = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with PgFleet(pg_url) as f:
            st = f.run_store(rid)
            wait_for(
                lambda: any(s.state == "running" and s.phase == "agent" for s in st.sessions()),
                120,
                "session 1 in its agent phase",
            )
            st.close()
        # The agent's first model call went through the broker (its `sleep` comes after).
        wait_for(lambda: (work / rid).exists() and _local_allows(work, rid) > 0, 60, "a model call")
        local = _local_allows(work, rid)
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait()
    cg = RunCgroup.detect(rid)
    assert cg is not None
    cg.sweep()  # the host's processes are gone...
    shutil.rmtree(work)  # ...and its disk
    with PgFleet(pg_url) as f:
        j = f.journal()
        [(n,)] = j.execute(
            "SELECT count(*) FROM journal_observations WHERE run = %s AND session = '1'"
            " AND decision = 'allow'",
            (rid,),
        )
        j.close()
    assert n >= local > 0


def _local_allows(work: Path, rid: str) -> int:
    import sqlite3

    found = 0
    for p in work.glob(f"{rid}/lease-*/{rid}/journal.sqlite"):
        c = sqlite3.connect(f"{p.as_uri()}?mode=ro", uri=True)
        try:
            found += c.execute(
                "SELECT count(*) FROM observations WHERE session = '1' AND decision = 'allow'"
            ).fetchone()[0]
        except sqlite3.Error:
            pass
        finally:
            c.close()
    return found
