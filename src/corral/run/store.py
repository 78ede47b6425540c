"""Durable run state: `.corral/runs/<id>/state.sqlite`, and the per-run lock.

Every state transition is committed (WAL, `synchronous=FULL`) *before* the
coordinator acts on it, so after a crash at any point the database says what
might have been running: a session whose state is still `running` was
interrupted. The coordinator holds an exclusive `flock` on `run.lock` for as
long as it drives the run; the kernel drops it when the process dies
(SIGKILL included), which is how `corral status` tells a live run from a
crashed one and how `corral resume` refuses to drive a run twice at once.

Run states: `created` → `running` → `passed` | `exhausted` | `failed` |
`stopped`; `running` ⇄ `paused` (`corral pause`/`resume`: each pause is a row
of `pauses`, committed before the cgroup is frozen and closed once it is
thawed, its start and end also on CLOCK_MONOTONIC, which every process of the
host shares until a reboot (so each row names its boot), so the coordinator
subtracts paused time from its deadlines). Session states: `running` (with a
`phase`: agent, commit, product, verify) → `done` | `interrupted`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from corral.errors import CorralError, UsageError
from corral.sqlrows import Row, record

__all__ = [
    "TERMINAL_RUN_STATES",
    "CheckResult",
    "RunLock",
    "RunLockedError",
    "RunRecord",
    "RunState",
    "SessionRecord",
    "Store",
    "now_iso",
    "paused_seconds",
]

RunState = Literal["created", "running", "paused", "passed", "exhausted", "failed", "stopped"]
TERMINAL_RUN_STATES: Final = frozenset({"passed", "exhausted", "failed", "stopped"})

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS run (
    id TEXT PRIMARY KEY,
    mission TEXT NOT NULL,
    state TEXT NOT NULL,
    agent TEXT NOT NULL,
    provider TEXT NOT NULL,
    max_sessions INTEGER NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    coordinator_pid INTEGER,
    stop_requested INTEGER NOT NULL DEFAULT 0,
    end_reason TEXT,
    memory_cap INTEGER NOT NULL,
    peak_memory INTEGER NOT NULL DEFAULT 0,
    base_commit TEXT,
    last_commit TEXT
);
CREATE TABLE IF NOT EXISTS sessions (
    n INTEGER PRIMARY KEY,
    state TEXT NOT NULL,
    phase TEXT NOT NULL,
    started TEXT NOT NULL,
    ended TEXT,
    end_reason TEXT,
    agent_exit INTEGER,
    commit_sha TEXT,
    tokens INTEGER NOT NULL DEFAULT 0,
    wall_s REAL NOT NULL DEFAULT 0,
    agent_peak_memory INTEGER NOT NULL DEFAULT 0,
    run_peak_memory INTEGER NOT NULL DEFAULT 0,
    processes_killed INTEGER NOT NULL DEFAULT 0,
    product_ready INTEGER,
    checks_passed INTEGER NOT NULL DEFAULT 0,
    checks_total INTEGER NOT NULL DEFAULT 0,
    summary TEXT NOT NULL DEFAULT '',
    broker_pid INTEGER,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS checks (
    session INTEGER NOT NULL,
    name TEXT NOT NULL,
    passed INTEGER NOT NULL,
    reason TEXT NOT NULL,
    exit INTEGER,
    duration_s REAL NOT NULL,
    output TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (session, name)
);
CREATE TABLE IF NOT EXISTS pauses (
    id INTEGER PRIMARY KEY,
    started TEXT NOT NULL,
    started_mono REAL NOT NULL,
    ended TEXT,
    ended_mono REAL,
    boot TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    session INTEGER,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
"""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def paused_seconds(intervals: list[tuple[float, float | None]], since: float, now: float) -> float:
    """How much of [since, now] the intervals cover; an open one runs to `now` (pure)."""
    total = 0.0
    for start, end in intervals:
        lo, hi = max(start, since), min(now if end is None else end, now)
        if hi > lo:
            total += hi - lo
    return total


class RunLockedError(CorralError, RuntimeError):
    """Another coordinator is driving this run."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    mission: str
    state: str
    agent: str
    provider: str
    max_sessions: int
    created: str
    updated: str
    coordinator_pid: int | None
    stop_requested: bool
    end_reason: str | None
    memory_cap: int
    peak_memory: int
    base_commit: str | None
    last_commit: str | None


@dataclass(frozen=True, slots=True)
class SessionRecord:
    n: int
    state: str
    phase: str
    started: str
    ended: str | None
    end_reason: str | None
    agent_exit: int | None
    commit_sha: str | None
    tokens: int
    wall_s: float
    agent_peak_memory: int
    run_peak_memory: int
    processes_killed: int
    product_ready: bool | None
    checks_passed: int
    checks_total: int
    summary: str
    broker_pid: int | None
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """How one acceptance check ended in one session."""

    name: str
    passed: bool
    reason: str
    exit: int | None
    duration_s: float
    output: str = ""


class RunLock:
    """An exclusive flock on `<run>/run.lock`; released by `release()` or process death."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "run.lock"
        self._fd: int | None = None

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lock, waiting up to `wait_s`; RunLockedError if it stays held.

        A short wait covers a child that was between fork and exec when its
        parent coordinator was killed: it holds a copy of the descriptor
        (close-on-exec only acts at exec) for a few milliseconds.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise RunLockedError(
                        f"run {self.path.parent.name} is being driven by another corral process"
                    ) from None
                time.sleep(0.05)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def is_held(run_dir: Path) -> bool:
        """Whether some process holds the lock right now."""
        path = run_dir / "run.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


def run_record(r: Row) -> RunRecord:
    """A run row (the columns `RUN_COLS` names) as a record; both stores read it so."""
    return record(RunRecord, r, convert={"stop_requested": bool})


def session_record(r: Row) -> SessionRecord:
    """A session row (the columns `SESSION_COLS` names) as a record."""
    return record(
        SessionRecord,
        r,
        convert={
            "wall_s": float,
            "product_ready": lambda v: None if v is None else bool(v),
            "detail": lambda v: dict(json.loads(v)),
        },
    )


def check_result(r: Sequence[Any]) -> CheckResult:
    """A `name, passed, reason, exit, duration_s, output` row as a result."""
    return CheckResult(r[0], bool(r[1]), r[2], r[3], float(r[4]), r[5])


def event_row(r: Sequence[Any]) -> tuple[str, int | None, str, dict[str, Any]]:
    """A `time, session, kind, detail` row with its detail decoded."""
    return (r[0], r[1], r[2], dict(json.loads(r[3])))


def pause_interval(r: Sequence[Any]) -> tuple[float, float | None]:
    """A `started_mono, ended_mono` row; end None while the pause lasts."""
    return (float(r[0]), None if r[1] is None else float(r[1]))


RUN_COLS: Final = (
    "id, mission, state, agent, provider, max_sessions, created, updated, coordinator_pid,"
    " stop_requested, end_reason, memory_cap, peak_memory, base_commit, last_commit"
)
SESSION_COLS: Final = (
    "n, state, phase, started, ended, end_reason, agent_exit, commit_sha, tokens, wall_s,"
    " agent_peak_memory, run_peak_memory, processes_killed, product_ready, checks_passed,"
    " checks_total, summary, broker_pid, detail"
)
RUN_NAMES: Final = tuple(RUN_COLS.replace(" ", "").split(","))
SESSION_NAMES: Final = tuple(SESSION_COLS.replace(" ", "").split(","))
SESSION_FIELDS: Final = frozenset(SESSION_NAMES)
#: The run columns a coordinator may update.
RUN_FIELDS: Final = frozenset(
    {
        "state",
        "coordinator_pid",
        "stop_requested",
        "end_reason",
        "peak_memory",
        "base_commit",
        "last_commit",
    }
)


class Store:
    """The state database of one run. Each call is one committed transaction."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        try:
            if readonly:
                self._conn = sqlite3.connect(
                    f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=10.0
                )
                self._conn.row_factory = sqlite3.Row
            else:
                self._conn = sqlite3.connect(path, isolation_level=None, timeout=10.0)
                self._conn.row_factory = sqlite3.Row
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=FULL")
                self._conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise UsageError(f"cannot open run state {path}: {exc}") from exc

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Cursor]:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    # -- run --------------------------------------------------------------
    def create_run(
        self,
        run_id: str,
        *,
        mission: str,
        agent: str,
        provider: str,
        max_sessions: int,
        memory_cap: int,
    ) -> None:
        t = now_iso()
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO run (id, mission, state, agent, provider, max_sessions, created,"
                " updated, memory_cap) VALUES (?,?,?,?,?,?,?,?,?)",
                (run_id, mission, "created", agent, provider, max_sessions, t, t, memory_cap),
            )

    def run(self) -> RunRecord:
        row = self._conn.execute(f"SELECT {RUN_COLS} FROM run").fetchone()
        if row is None:
            raise UsageError(f"{self.path}: no run recorded")
        return run_record(row)

    def update_run(self, **fields: object) -> None:
        bad = set(fields) - RUN_FIELDS
        if bad:
            raise ValueError(f"unknown run fields {sorted(bad)}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx() as cur:
            cur.execute(f"UPDATE run SET {cols}, updated = ?", (*fields.values(), now_iso()))

    # -- sessions ---------------------------------------------------------
    def begin_session(self, n: int, phase: str = "agent") -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO sessions (n, state, phase, started) VALUES (?,?,?,?)",
                (n, "running", phase, now_iso()),
            )
            cur.execute(
                "INSERT INTO events (time, session, kind, detail) VALUES (?,?,?,?)",
                (now_iso(), n, "session_start", "{}"),
            )

    def update_session(self, n: int, **fields: object) -> None:
        bad = set(fields) - SESSION_FIELDS
        if bad:
            raise ValueError(f"unknown session fields {sorted(bad)}")
        values = [json.dumps(v) if k == "detail" else v for k, v in fields.items()]
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx() as cur:
            cur.execute(f"UPDATE sessions SET {cols} WHERE n = ?", (*values, n))

    def end_session(self, n: int, *, state: str, end_reason: str, **fields: object) -> None:
        self.update_session(n, state=state, end_reason=end_reason, ended=now_iso(), **fields)

    def sessions(self) -> list[SessionRecord]:
        rows = self._conn.execute(f"SELECT {SESSION_COLS} FROM sessions ORDER BY n").fetchall()
        return [session_record(r) for r in rows]

    def session(self, n: int) -> SessionRecord | None:
        row = self._conn.execute(
            f"SELECT {SESSION_COLS} FROM sessions WHERE n = ?", (n,)
        ).fetchone()
        return None if row is None else session_record(row)

    def mark_interrupted(self) -> list[int]:
        """Sessions still `running` (their coordinator died) become `interrupted`."""
        with self._tx() as cur:
            rows = cur.execute("SELECT n, phase FROM sessions WHERE state = 'running'").fetchall()
            for n, phase in rows:
                cur.execute(
                    "UPDATE sessions SET state = 'interrupted', end_reason = ?, ended = ?"
                    " WHERE n = ?",
                    (f"interrupted during {phase}", now_iso(), n),
                )
                cur.execute(
                    "INSERT INTO events (time, session, kind, detail) VALUES (?,?,?,?)",
                    (now_iso(), n, "session_interrupted", json.dumps({"phase": phase})),
                )
        return [int(n) for n, _ in rows]

    # -- pauses -----------------------------------------------------------
    def begin_pause(self, reason: str) -> bool:
        """Record that the run is paused (state `paused`); False if it already was."""
        t, mono = now_iso(), time.monotonic()
        with self._tx() as cur:
            if cur.execute("SELECT 1 FROM pauses WHERE ended IS NULL").fetchone():
                return False
            cur.execute(
                "INSERT INTO pauses (started, started_mono, boot, reason) VALUES (?,?,?,?)",
                (t, mono, _boot_id(), reason),
            )
            cur.execute("UPDATE run SET state = 'paused', updated = ?", (t,))
            cur.execute(
                "INSERT INTO events (time, session, kind, detail) VALUES (?,?,?,?)",
                (t, None, "paused", json.dumps({"reason": reason})),
            )
        return True

    def end_pause(self) -> bool:
        """Close the open pause (state back to `running`); False if none was open."""
        t, mono = now_iso(), time.monotonic()
        with self._tx() as cur:
            row = cur.execute("SELECT id FROM pauses WHERE ended IS NULL").fetchone()
            if row is None:
                return False
            cur.execute(
                "UPDATE pauses SET ended = ?, ended_mono = ? WHERE id = ?", (t, mono, row[0])
            )
            cur.execute(
                "UPDATE run SET state = 'running', updated = ? WHERE state = 'paused'", (t,)
            )
            cur.execute(
                "INSERT INTO events (time, session, kind, detail) VALUES (?,?,?,?)",
                (t, None, "resumed", "{}"),
            )
        return True

    def paused(self) -> bool:
        return self._conn.execute("SELECT 1 FROM pauses WHERE ended IS NULL").fetchone() is not None

    def pause_intervals(self) -> list[tuple[float, float | None]]:
        """This boot's pauses as (start, end) on CLOCK_MONOTONIC; end None while paused."""
        rows = self._conn.execute(
            "SELECT started_mono, ended_mono FROM pauses WHERE boot = ? ORDER BY id",
            (_boot_id(),),
        ).fetchall()
        return [pause_interval(r) for r in rows]

    def paused_s(self, since: float, now: float) -> float:
        """Seconds of [since, now] (CLOCK_MONOTONIC) the run spent paused."""
        return paused_seconds(self.pause_intervals(), since, now)

    # -- checks -----------------------------------------------------------
    def record_checks(self, n: int, results: list[CheckResult]) -> None:
        with self._tx() as cur:
            for r in results:
                cur.execute(
                    "INSERT OR REPLACE INTO checks (session, name, passed, reason, exit,"
                    " duration_s, output) VALUES (?,?,?,?,?,?,?)",
                    (n, r.name, int(r.passed), r.reason, r.exit, r.duration_s, r.output[-4000:]),
                )
            passed = sum(1 for r in results if r.passed)
            cur.execute(
                "UPDATE sessions SET checks_passed = ?, checks_total = ? WHERE n = ?",
                (passed, len(results), n),
            )

    def checks(self, n: int) -> list[CheckResult]:
        rows = self._conn.execute(
            "SELECT name, passed, reason, exit, duration_s, output FROM checks"
            " WHERE session = ? ORDER BY rowid",
            (n,),
        ).fetchall()
        return [check_result(r) for r in rows]

    # -- events -----------------------------------------------------------
    def event(self, kind: str, session: int | None = None, **detail: object) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO events (time, session, kind, detail) VALUES (?,?,?,?)",
                (now_iso(), session, kind, json.dumps(detail, default=str)),
            )

    def events(self) -> list[tuple[str, int | None, str, dict[str, Any]]]:
        rows = self._conn.execute(
            "SELECT time, session, kind, detail FROM events ORDER BY id"
        ).fetchall()
        return [event_row(r) for r in rows]

    def integrity_ok(self) -> bool:
        return bool(self._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
