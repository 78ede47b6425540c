"""One conformance suite for both run-state stores (SQLite file, PostgreSQL) and both journals."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.run.store import CheckResult, Store
from corral.run.store_api import RunStateStore

WRITER = Path(__file__).with_name("writer.py")
RUN = "r1"


def _src_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).parents[3] / "src")
    return env


class Impl:
    """How to open one implementation, in this process and from a child."""

    def __init__(self, kind: str, where: str, opener: Callable[[], RunStateStore]) -> None:
        self.kind, self.where, self.open = kind, where, opener


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.requires_postgresql)]
)
def impl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    if request.param == "sqlite":
        path = tmp_path / "state.sqlite"
        it = Impl("sqlite", str(path), lambda: Store(path))
    else:
        url = request.getfixturevalue("pg_url")
        from corral.store.postgres import PgFleet, PgRunStore

        PgFleet(url).close()  # migrate
        it = Impl("pg", url, lambda: PgRunStore(url, RUN))
    s = it.open()
    s.create_run(
        RUN, mission="m", agent="script", provider="synthetic", max_sessions=3, memory_cap=1
    )
    s.close()
    yield it


def test_round_trip(impl: Impl) -> None:
    with_store = impl.open()
    try:
        s = with_store
        s.update_run(state="running", last_commit="abc")
        s.begin_session(1)
        s.update_session(1, phase="verify", tokens=7, detail={"k": 1})
        s.record_checks(
            1, [CheckResult("a", True, "passed", 0, 0.1), CheckResult("b", False, "x", 1, 0.2)]
        )
        s.end_session(1, state="done", end_reason="agent finished")
        assert s.run().state == "running" and s.run().last_commit == "abc"
        [one] = s.sessions()
        assert (one.n, one.state, one.tokens, one.checks_passed, one.checks_total) == (
            1,
            "done",
            7,
            1,
            2,
        )
        assert one.detail == {"k": 1}
        assert [c.name for c in s.checks(1)] == ["a", "b"]
        assert s.begin_pause("user") and not s.begin_pause("user") and s.paused()
        assert s.end_pause() and not s.paused()
        kinds = [e[2] for e in s.events()]
        assert kinds[:1] == ["session_start"] and "paused" in kinds
    finally:
        with_store.close()


def test_acknowledged_writes_survive_kill9(impl: Impl) -> None:
    """SIGKILL a writer at a random instant: every acknowledged event is there, none torn."""
    rng = random.Random(1234)
    acked = 0
    for round_ in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(WRITER), impl.kind, impl.where, RUN, f"t{round_}", "100000"],
            stdout=subprocess.PIPE,
            text=True,
            env=_src_env(),
        )
        assert proc.stdout is not None
        # Decide the kill point by acknowledgements seen (a counter), never by time.
        kill_after = rng.randint(20, 120)
        seen = -1
        for line in proc.stdout:
            seen = int(line)
            if seen >= kill_after:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # The writer kept going until the signal landed: acknowledgements it
        # printed after the one that decided the kill are acknowledged too.
        for line in proc.stdout:
            if line.strip().isdigit():
                seen = max(seen, int(line))
        proc.stdout.close()
        acked += seen + 1
        s = impl.open()
        try:
            got = [e[3]["i"] for e in s.events() if e[2] == "tick" and e[3]["tag"] == f"t{round_}"]
        finally:
            s.close()
        # Acked rows are all there, in order; at most the in-flight one beyond.
        assert got[: seen + 1] == list(range(seen + 1))
        assert len(got) - (seen + 1) in (0, 1)
    assert acked > 0


def test_concurrent_writers(impl: Impl) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, str(WRITER), impl.kind, impl.where, RUN, f"w{k}", "40"],
            stdout=subprocess.DEVNULL,
            env=_src_env(),
        )
        for k in range(4)
    ]
    assert [p.wait(120) for p in procs] == [0, 0, 0, 0]
    s = impl.open()
    try:
        ticks = [(e[3]["tag"], e[3]["i"]) for e in s.events() if e[2] == "tick"]
    finally:
        s.close()
    assert sorted(ticks) == sorted((f"w{k}", i) for k in range(4) for i in range(40))


def _obs_row(i: int) -> tuple[object, ...]:
    from corral.broker.actions import Observation
    from corral.broker.journal import observation_row

    return observation_row(
        Observation(
            run=RUN,
            session="1",
            env="agent",
            kind="net_connect",
            target=f"h{i}:443",
            decision="deny",
            rule=None,
            reason="test",
        )
    )


def test_journal_append_only(impl: Impl, tmp_path: Path) -> None:
    """UPDATE, DELETE (and TRUNCATE) on the journal are refused; the rows stay as written."""
    import sqlite3

    from corral.errors import JournalError

    if impl.kind == "sqlite":
        from corral.broker.journal import Journal

        j = Journal(tmp_path / "journal.sqlite")
        j.commit([_obs_row(1), _obs_row(2)], ())
        j.close()
        conn = sqlite3.connect(tmp_path / "journal.sqlite")
        for sql in ("UPDATE observations SET decision = 'allow'", "DELETE FROM observations"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                conn.execute(sql)
        rows = conn.execute("SELECT decision FROM observations").fetchall()
        conn.close()
        assert rows == [("deny",), ("deny",)]
        return
    from corral.store.postgres import PgJournal

    pj = PgJournal(impl.where)
    try:
        ids = pj.commit([_obs_row(1), _obs_row(2)], ())
        assert len(ids) == 2
        from corral.broker.journal import outcome_row

        pj.commit((), [outcome_row(ids[0], 5, 6, {})])
        for sql in (
            "UPDATE journal_observations SET decision = 'allow'",
            "DELETE FROM journal_observations",
            "TRUNCATE journal_observations CASCADE",
            "UPDATE journal_outcomes SET bytes_up = 0",
            "DELETE FROM journal_outcomes",
        ):
            with pytest.raises(JournalError, match="append-only"):
                pj.execute(sql)
        rows = pj.execute("SELECT decision FROM journal_observations ORDER BY id")
        assert rows == [("deny",), ("deny",)]
        assert pj.execute("SELECT bytes_up FROM journal_outcomes") == [(5,)]
    finally:
        pj.close()
