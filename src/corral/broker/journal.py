"""The journal: an append-only SQLite database in WAL mode.

Two tables, both append-only (triggers abort any UPDATE or DELETE):

- `observations`: one row per observation (see `Observation`), written and
  committed *before* the action it allows is carried out;
- `outcomes`: at most one row per observation, appended when an allowed
  action finishes (final byte counts, status, error). Readers merge it in.

`Journal` writes synchronously: a call returns once its transaction is
committed, i.e. the row is in the WAL file. The broker goes through
`GroupCommitJournal`, which folds the appends of many concurrent requests
into one transaction and resumes each request only after that commit. With
`synchronous=NORMAL` (the default) a committed row survives the death of the
process (SIGKILL); surviving power loss needs `synchronous=FULL` (an fsync
per commit). Several processes may append to one journal; SQLite serialises
them (busy timeout 5 s).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from corral.broker.actions import Identity, Observation, ProcessEvent
from corral.errors import JournalError
from corral.sqlrows import record

if TYPE_CHECKING:
    from corral.sandbox.spec import ExecResult, Limits

__all__ = [
    "SCHEMA_VERSION",
    "GroupCommitJournal",
    "Journal",
    "JournalRow",
    "decision_counts",
    "iter_rows",
    "observation_row",
    "outcome_observations",
    "outcome_row",
    "read_rows",
]

SCHEMA_VERSION: Final = 1

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    run TEXT,
    session TEXT,
    env TEXT NOT NULL,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    decision TEXT NOT NULL CHECK (decision IN ('allow', 'deny', 'observe')),
    rule TEXT,
    reason TEXT NOT NULL,
    bytes_up INTEGER NOT NULL DEFAULT 0,
    bytes_down INTEGER NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT '{}',
    cause INTEGER
);
CREATE TABLE IF NOT EXISTS outcomes (
    observation INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    bytes_up INTEGER NOT NULL,
    bytes_down INTEGER NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE TRIGGER IF NOT EXISTS observations_no_update BEFORE UPDATE ON observations
    BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END;
CREATE TRIGGER IF NOT EXISTS observations_no_delete BEFORE DELETE ON observations
    BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END;
CREATE TRIGGER IF NOT EXISTS outcomes_no_update BEFORE UPDATE ON outcomes
    BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END;
CREATE TRIGGER IF NOT EXISTS outcomes_no_delete BEFORE DELETE ON outcomes
    BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END;
"""

_INSERT_OBS: Final = (
    "INSERT INTO observations (time, run, session, env, kind, target, decision, rule,"
    " reason, bytes_up, bytes_down, detail, cause) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_OUTCOME: Final = (
    "INSERT OR IGNORE INTO outcomes (observation, time, bytes_up, bytes_down, detail)"
    " VALUES (?,?,?,?,?)"
)


def _dumps(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    # check_same_thread=False: a Journal may be used from several threads; its lock serialises.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise JournalError(f"{path}: WAL mode unavailable (got {mode})")
        conn.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise JournalError(f"{path}: journal schema {version}, expected {SCHEMA_VERSION}")
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn


def observation_row(obs: Observation) -> tuple[Any, ...]:
    """The SQL parameters of one observation (raises on a detail that is not JSON)."""
    return (
        obs.time.isoformat(timespec="microseconds"),
        obs.run,
        obs.session,
        obs.env,
        obs.kind,
        obs.target,
        obs.decision,
        obs.rule,
        obs.reason,
        obs.bytes_up,
        obs.bytes_down,
        _dumps(obs.detail),
        obs.cause,
    )


def outcome_row(
    observation_id: int, bytes_up: int, bytes_down: int, detail: dict[str, Any]
) -> tuple[Any, ...]:
    """The SQL parameters of one outcome, stamped now."""
    return (
        observation_id,
        datetime.now(UTC).isoformat(timespec="microseconds"),
        bytes_up,
        bytes_down,
        _dumps(detail),
    )


def outcome_observations(
    result: ExecResult, identity: Identity, limits: Limits
) -> list[Observation]:
    """What the journal records about how a sandbox ended (pure): a limit that
    was hit, processes left behind, and the exit itself, in that order."""
    out: list[tuple[str, bool, str, dict[str, Any]]] = []  # event, denied, reason, detail
    if result.reason == "timeout":
        why = f"wall-clock limit {limits.timeout_s or 0:g}s reached"
        out.append(("timeout", True, why, {"timeout_s": limits.timeout_s}))
    if result.oom_kills:
        why = f"{result.oom_kills} process(es) killed by the memory limit"
        detail = {"memory_bytes": limits.memory_bytes, "oom_kills": result.oom_kills}
        out.append(("oom_kill", True, why, detail))
    if result.pids_limit_hits:
        why = f"fork refused {result.pids_limit_hits} time(s) at the pids limit"
        out.append(("pids_limit", True, why, {"pids": limits.pids, "hits": result.pids_limit_hits}))
    if result.processes_killed_at_end:
        n = result.processes_killed_at_end
        out.append(
            (
                "killed_at_teardown",
                False,
                f"{n} process(es) killed when the task ended",
                {"count": n, "names": [name[:64] for name in result.killed_names[:16]]},
            )
        )
    exit_detail: dict[str, Any] = {
        "exit": result.exit,
        "reason": result.reason,
        "wall_s": round(result.wall_s, 4),
        "peak_memory_bytes": result.peak_memory_bytes,
    }
    out.append(("exit", False, f"exit {result.exit} ({result.reason})", exit_detail))
    return [
        Observation.of(
            ProcessEvent(event=event),
            identity,
            decision="deny" if denied else "observe",
            rule=None,
            reason=reason,
            detail=detail,
        )
        for event, denied, reason, detail in out
    ]


class Journal:
    """A writable journal; every write is committed before the call returns.

    Thread-safe. Raises JournalError from the constructor when the file cannot
    be opened, put in WAL mode or given the schema (the broker refuses to
    start then), and from writes that fail (the caller must then not carry
    out the action).
    """

    def __init__(self, path: str | Path, synchronous: Literal["normal", "full"] = "normal") -> None:
        self.path = Path(path)
        try:
            self._conn: sqlite3.Connection | None = _connect(self.path, synchronous)
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open journal {self.path}: {exc}") from exc
        self._lock = threading.Lock()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, obs: Observation) -> int:
        """Commit `obs`; its row id."""
        return self.commit([observation_row(obs)], ())[0]

    def record_outcome(
        self, observation_id: int, bytes_up: int, bytes_down: int, detail: dict[str, Any]
    ) -> None:
        """Commit how an allowed action ended (at most one outcome per observation)."""
        self.commit((), [outcome_row(observation_id, bytes_up, bytes_down, detail)])

    def commit(
        self, observations: Sequence[tuple[Any, ...]], outcomes: Sequence[tuple[Any, ...]]
    ) -> list[int]:
        """Insert rows made by `observation_row`/`outcome_row` in one transaction.

        Returns the observations' ids in order, once committed.
        """
        with self._lock:
            conn = self._conn
            if conn is None:
                raise JournalError(f"journal {self.path} is closed")
            ids: list[int] = []
            cur = conn.cursor()
            if len(observations) + len(outcomes) == 1:
                # One statement commits by itself (autocommit): one call
                # into SQLite instead of three.
                try:
                    if observations:
                        cur.execute(_INSERT_OBS, observations[0])
                        return [int(cur.lastrowid or 0)]
                    cur.execute(_INSERT_OUTCOME, outcomes[0])
                    return []
                except sqlite3.Error as exc:
                    raise JournalError(f"journal write failed: {exc}") from exc
            try:
                cur.execute("BEGIN IMMEDIATE")
                try:
                    for row in observations:
                        cur.execute(_INSERT_OBS, row)
                        ids.append(int(cur.lastrowid or 0))
                    for row in outcomes:
                        cur.execute(_INSERT_OUTCOME, row)
                    cur.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.rollback()
                    raise
            except sqlite3.Error as exc:
                raise JournalError(f"journal write failed: {exc}") from exc
            return ids

    def flush(self) -> None:
        """Nothing to do: every write is committed before it returns."""

    def close(self) -> None:
        """Close the database (everything written is already committed)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class GroupCommitJournal:
    """The event loop's front of a `Journal`: group commit without a thread.

    Every `append` made while the loop runs other callbacks joins one
    transaction, committed by a callback scheduled with `call_soon`; each
    awaiting caller resumes only after that commit. The commit runs on the
    loop itself (tens of microseconds in WAL mode), which costs less than
    handing every row to a writer thread and back. Outcomes are buffered and
    committed with the next batch or within `outcome_delay_s`; an outcome may
    be lost if the process is killed, an acknowledged observation never is.
    """

    def __init__(self, journal: Journal, outcome_delay_s: float = 0.05) -> None:
        self.journal = journal
        self._delay = outcome_delay_s
        self._rows: list[tuple[Any, ...]] = []
        self._futures: list[asyncio.Future[int]] = []
        self._outcomes: list[tuple[Any, ...]] = []
        self._soon: asyncio.Handle | None = None
        self._later: asyncio.TimerHandle | None = None

    async def append(self, obs: Observation) -> int:
        """Commit `obs` (with whatever else is pending); its row id."""
        row = observation_row(obs)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._rows.append(row)
        self._futures.append(future)
        if self._soon is None:
            self._soon = loop.call_soon(self._flush)
        return await future

    def record_outcome(
        self, observation_id: int, bytes_up: int, bytes_down: int, detail: dict[str, Any]
    ) -> None:
        """Buffer an outcome for the next commit."""
        self._outcomes.append(outcome_row(observation_id, bytes_up, bytes_down, detail))
        if self._soon is None and self._later is None:
            self._later = asyncio.get_running_loop().call_later(self._delay, self._flush)

    def flush(self) -> None:
        """Commit everything pending now."""
        self._flush()

    def _flush(self) -> None:
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self._later is not None:
            self._later.cancel()
            self._later = None
        rows, futures, outcomes = self._rows, self._futures, self._outcomes
        self._rows, self._futures, self._outcomes = [], [], []
        if not rows and not outcomes:
            return
        try:
            ids = self.journal.commit(rows, outcomes)
        except JournalError as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        for future, rowid in zip(futures, ids, strict=True):
            if not future.done():
                future.set_result(rowid)


@dataclass(frozen=True, slots=True)
class JournalRow:
    """One observation as read back, merged with its outcome when there is one."""

    id: int
    time: str
    run: str | None
    session: str | None
    env: str
    kind: str
    target: str
    decision: str
    rule: str | None
    reason: str
    bytes_up: int
    bytes_down: int
    detail: dict[str, Any]
    cause: int | None
    outcome: dict[str, Any] | None

    def to_json_dict(self) -> dict[str, Any]:
        """The docs/design.md section 6a shape; id, bytes, cause and outcome go in `detail`."""
        detail: dict[str, Any] = dict(self.detail)
        detail["id"] = self.id
        detail["bytes_up"] = self.bytes_up
        detail["bytes_down"] = self.bytes_down
        if self.cause is not None:
            detail["cause"] = self.cause
        if self.outcome is not None:
            detail["outcome"] = self.outcome
        return {
            "time": self.time,
            "run": self.run,
            "session": self.session,
            "env": self.env,
            "kind": self.kind,
            "target": self.target,
            "decision": self.decision,
            "rule": self.rule,
            "reason": self.reason,
            "detail": detail,
        }


_SELECT: Final = (
    "SELECT o.id, o.time, o.run, o.session, o.env, o.kind, o.target, o.decision, o.rule,"
    " o.reason, o.bytes_up, o.bytes_down, o.detail, o.cause, x.time AS outcome_time,"
    " x.bytes_up AS outcome_up, x.bytes_down AS outcome_down, x.detail AS outcome_detail"
    " FROM observations o LEFT JOIN outcomes x ON x.observation = o.id"
)


def _row(r: sqlite3.Row) -> JournalRow:
    if r["outcome_time"] is None:
        given: dict[str, Any] = {"outcome": None}
    else:
        outcome = dict(json.loads(r["outcome_detail"]))
        outcome["time"] = r["outcome_time"]
        given = {"outcome": outcome, "bytes_up": r["outcome_up"], "bytes_down": r["outcome_down"]}
    return record(JournalRow, r, convert={"detail": lambda v: dict(json.loads(v))}, given=given)


def read_rows(
    path: str | Path,
    *,
    denied_only: bool = False,
    kind: str | None = None,
    after_id: int = 0,
    limit: int | None = None,
) -> list[JournalRow]:
    """Observations with id > `after_id`, oldest first, optionally filtered.

    Opens the journal read-only; raises JournalError when it is missing or
    not a journal.
    """
    return list(iter_rows(path, denied_only=denied_only, kind=kind, after_id=after_id, limit=limit))


def iter_rows(
    path: str | Path,
    *,
    denied_only: bool = False,
    kind: str | None = None,
    after_id: int = 0,
    limit: int | None = None,
) -> Iterator[JournalRow]:
    """Like `read_rows`, lazily."""
    p = Path(path)
    if not p.is_file():
        raise JournalError(f"no journal at {p}")
    where = ["o.id > ?"]
    args: list[Any] = [after_id]
    if denied_only:
        where.append("o.decision = 'deny'")
    if kind is not None:
        where.append("o.kind = ?")
        args.append(kind)
    sql = f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY o.id"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    try:
        conn = sqlite3.connect(f"{p.absolute().as_uri()}?mode=ro", uri=True, timeout=5.0)
        conn.row_factory = sqlite3.Row
    except sqlite3.Error as exc:
        raise JournalError(f"cannot open journal {p}: {exc}") from exc
    try:
        for r in conn.execute(sql, args):
            yield _row(r)
    except sqlite3.Error as exc:
        raise JournalError(f"cannot read journal {p}: {exc}") from exc
    finally:
        conn.close()


def decision_counts(path: Path, run_id: str) -> tuple[int, int]:
    """(allowed, denied) observations of `run_id`, process events left out.

    (0, 0) when the journal does not exist (yet) or cannot be read: this feeds
    progress lines and summaries, never a decision.
    """
    if not path.is_file():
        return 0, 0
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            rows = conn.execute(
                "SELECT decision, COUNT(*) FROM observations WHERE run = ? AND"
                " kind != 'process_event' GROUP BY decision",
                (run_id,),
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return 0, 0
    counts = dict(rows)
    return int(counts.get("allow", 0)), int(counts.get("deny", 0))
