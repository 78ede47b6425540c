"""Journal row shape, append-only enforcement, group commit, outcomes."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path

import pytest

from corral.broker.actions import HttpRequest, Identity, NetConnect, Observation, ProcessEvent
from corral.broker.journal import GroupCommitJournal, Journal, read_rows
from corral.errors import JournalError

DESIGN_6A_KEYS = {
    "time",
    "run",
    "session",
    "env",
    "kind",
    "target",
    "decision",
    "rule",
    "reason",
    "detail",
}


def _obs(i: int = 0, decision: str = "allow") -> Observation:
    action = HttpRequest(host="pypi.test", port=80, method="GET", path=f"/p/{i}")
    return Observation.of(
        action,
        Identity(run="run-1", session="s1", env="agent"),
        decision="allow" if decision == "allow" else "deny",
        rule="allow:pypi.test",
        reason="admitted",
        detail={"method": "GET", "n": i},
    )


def test_row_shape_matches_design_6a(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with Journal(path) as journal:
        rid = journal.append(_obs(1))
        journal.record_outcome(rid, 10, 20, {"status": 200})
        journal.append(
            Observation.of(
                ProcessEvent(event="oom_kill", pid=7),
                Identity(env="exec"),
                decision="observe",
                rule=None,
                reason="memory.max hit",
            )
        )
    rows = read_rows(path)
    assert len(rows) == 2
    first = rows[0].to_json_dict()
    assert set(first) == DESIGN_6A_KEYS
    assert first["run"] == "run-1"
    assert first["session"] == "s1"
    assert first["env"] == "agent"
    assert first["kind"] == "http_request"
    assert first["target"] == "GET http://pypi.test:80/p/1"
    assert first["decision"] == "allow"
    assert first["rule"] == "allow:pypi.test"
    assert first["detail"]["bytes_up"] == 10
    assert first["detail"]["bytes_down"] == 20
    assert first["detail"]["outcome"]["status"] == 200
    assert first["detail"]["n"] == 1
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    second = rows[1].to_json_dict()
    assert (second["decision"], second["rule"], second["run"]) == ("observe", None, None)
    json.dumps(first)


def test_rows_cannot_be_updated_or_deleted(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with Journal(path) as journal:
        rid = journal.append(_obs())
        journal.record_outcome(rid, 1, 1, {})
    conn = sqlite3.connect(path)
    try:
        for sql in (
            "UPDATE observations SET decision = 'allow'",
            "DELETE FROM observations",
            "UPDATE outcomes SET bytes_up = 0",
            "DELETE FROM outcomes",
        ):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                conn.execute(sql)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_filters_and_after_id(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with Journal(path) as journal:
        for i in range(6):
            journal.append(_obs(i, "deny" if i % 2 else "allow"))
        journal.append(
            Observation.of(
                NetConnect(host="x.test", port=443),
                Identity(),
                decision="deny",
                rule="default-deny",
                reason="no rule",
            )
        )
    assert [r.id for r in read_rows(path, denied_only=True)] == [2, 4, 6, 7]
    assert [r.id for r in read_rows(path, kind="net_connect")] == [7]
    assert [r.id for r in read_rows(path, after_id=5)] == [6, 7]
    assert [r.id for r in read_rows(path, limit=2)] == [1, 2]


def test_group_commit_acknowledges_only_committed_rows(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    seen: list[tuple[int, int]] = []
    with Journal(path) as journal:
        front = GroupCommitJournal(journal)

        async def one(i: int) -> None:
            rid = await front.append(_obs(i))
            # Acknowledged means visible to another connection right now.
            reader = sqlite3.connect(path)
            try:
                count = reader.execute("SELECT count(*) FROM observations WHERE id = ?", (rid,))
                seen.append((rid, count.fetchone()[0]))
            finally:
                reader.close()
            front.record_outcome(rid, i, i, {"i": i})

        async def run() -> None:
            await asyncio.gather(*(one(i) for i in range(50)))
            front.flush()

        asyncio.run(run())
    assert sorted(rid for rid, _ in seen) == list(range(1, 51))
    assert all(count == 1 for _, count in seen)
    rows = read_rows(path)
    assert all(r.outcome is not None and r.bytes_up == r.detail["n"] for r in rows)


def test_group_commit_failure_reaches_every_waiter(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with Journal(path) as journal:
        front = GroupCommitJournal(journal)
        sabotage = sqlite3.connect(path)
        sabotage.execute(
            "CREATE TRIGGER no BEFORE INSERT ON observations BEGIN SELECT RAISE(ABORT, 'full'); END"
        )
        sabotage.commit()
        sabotage.close()

        async def run() -> list[BaseException | int]:
            return await asyncio.gather(
                *(front.append(_obs(i)) for i in range(5)), return_exceptions=True
            )

        results = asyncio.run(run())
    assert all(isinstance(r, JournalError) for r in results)


def test_concurrent_threads_each_get_their_committed_row(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    ids: list[int] = []
    lock = threading.Lock()
    with Journal(path) as journal:

        def work(base: int) -> None:
            for i in range(100):
                rid = journal.append(_obs(base + i))
                # Acknowledged means visible to another connection right now.
                with lock:
                    ids.append(rid)

        threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reader = sqlite3.connect(path)
        try:
            count = reader.execute("SELECT count(*) FROM observations").fetchone()[0]
        finally:
            reader.close()
    assert count == 400
    assert sorted(ids) == list(range(1, 401))


def test_missing_or_foreign_file(tmp_path: Path) -> None:
    with pytest.raises(JournalError):
        read_rows(tmp_path / "nope.sqlite")
    (tmp_path / "garbage").write_bytes(b"not a database at all" * 100)
    with pytest.raises(JournalError):
        Journal(tmp_path / "garbage")
    with pytest.raises(JournalError):
        Journal(tmp_path / "no-such-dir" / "j.sqlite")


def test_closed_journal_refuses(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    journal.close()
    with pytest.raises(JournalError):
        journal.append(_obs())
