"""Run state, queue, leases and journal in PostgreSQL (psycopg 3), shared by a fleet of workers.

Schema: versioned migrations (`schema_migrations`), applied under a
transaction-scoped advisory lock so workers starting together migrate once.
Every table carries the run id; the per-run tables mirror the SQLite run
store (corral.run.store) so the coordinator sees one `RunStateStore`.

Leases: a run row holds `lease_owner`, `lease_epoch` and `lease_expires`
(the database's clock, never a worker's). `claim()` takes the oldest
unleased or expired, non-final run with `SELECT … FOR UPDATE SKIP LOCKED`
and bumps the epoch; a heartbeat `renew()`s it. Every write of a
`PgRunStore` bound to a lease first re-reads the run row `FOR SHARE` and
raises LeaseLostError unless the lease is still this worker's, same epoch,
unexpired: a worker that stalled past its expiry cannot write over the
worker that took the run over (fencing by the row lock, no clock of ours).

Exactly-once sessions: at takeover `mark_interrupted()` moves each session
left `running` into `session_attempts` (attempt k of session n) and deletes
it from `sessions`, so the coordinator, which numbers the next session
after the last recorded one, drives the same number again. A session is
counted in `sessions` once, when it ends; its lost attempts stay visible.

Workspace: the run's TrustedRepo travels as a git bundle stored in the run
row in the same transaction that records `last_commit`, so the durable
commit and the bytes to restore it can never disagree (docs/scale-out.md).

Journal: `journal_observations`/`journal_outcomes`, append-only by triggers
that raise on UPDATE, DELETE and TRUNCATE for every role but a superuser
who drops them; local SQLite journals are mirrored in idempotently, keyed
by (source, local id).
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, LiteralString, Self

from corral.broker.pgjournal import pg_connect
from corral.errors import LeaseLostError, StoreError, UsageError
from corral.run.store import (
    RUN_COLS,
    RUN_FIELDS,
    RUN_NAMES,
    SESSION_COLS,
    SESSION_FIELDS,
    SESSION_NAMES,
    CheckResult,
    RunRecord,
    SessionRecord,
    _boot_id,
    check_result,
    event_row,
    now_iso,
    pause_interval,
    paused_seconds,
    run_record,
    session_record,
)
from corral.sqlrows import named
from corral.store.testhook import pause_at

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "MIGRATIONS",
    "WORKER_GRANTS",
    "Lease",
    "PgFleet",
    "PgJournal",
    "PgRunStore",
    "QueuedRun",
    "grant_worker",
]

_ADVISORY_MIGRATE: Final = 0x636F7272  # "corr"

MIGRATIONS: Final[tuple[tuple[int, str], ...]] = (
    (
        1,
        """
CREATE TABLE runs (
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
    memory_cap BIGINT NOT NULL,
    peak_memory BIGINT NOT NULL DEFAULT 0,
    base_commit TEXT,
    last_commit TEXT,
    queued_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    files BYTEA,
    git_bundle BYTEA,
    lease_owner TEXT,
    lease_epoch BIGINT NOT NULL DEFAULT 0,
    lease_expires TIMESTAMPTZ,
    takeovers INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE sessions (
    run TEXT NOT NULL REFERENCES runs(id),
    n INTEGER NOT NULL,
    state TEXT NOT NULL,
    phase TEXT NOT NULL,
    started TEXT NOT NULL,
    ended TEXT,
    end_reason TEXT,
    agent_exit INTEGER,
    commit_sha TEXT,
    tokens BIGINT NOT NULL DEFAULT 0,
    wall_s DOUBLE PRECISION NOT NULL DEFAULT 0,
    agent_peak_memory BIGINT NOT NULL DEFAULT 0,
    run_peak_memory BIGINT NOT NULL DEFAULT 0,
    processes_killed INTEGER NOT NULL DEFAULT 0,
    product_ready INTEGER,
    checks_passed INTEGER NOT NULL DEFAULT 0,
    checks_total INTEGER NOT NULL DEFAULT 0,
    summary TEXT NOT NULL DEFAULT '',
    broker_pid INTEGER,
    detail TEXT NOT NULL DEFAULT '{}',
    worker TEXT,
    PRIMARY KEY (run, n)
);
CREATE TABLE session_attempts (
    run TEXT NOT NULL REFERENCES runs(id),
    n INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    phase TEXT NOT NULL,
    started TEXT NOT NULL,
    interrupted TEXT NOT NULL,
    worker TEXT,
    row TEXT NOT NULL,
    PRIMARY KEY (run, n, attempt)
);
CREATE TABLE checks (
    run TEXT NOT NULL REFERENCES runs(id),
    session INTEGER NOT NULL,
    name TEXT NOT NULL,
    ord INTEGER NOT NULL,
    passed INTEGER NOT NULL,
    reason TEXT NOT NULL,
    exit INTEGER,
    duration_s DOUBLE PRECISION NOT NULL,
    output TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run, session, name)
);
CREATE TABLE pauses (
    id BIGSERIAL PRIMARY KEY,
    run TEXT NOT NULL REFERENCES runs(id),
    started TEXT NOT NULL,
    started_mono DOUBLE PRECISION NOT NULL,
    ended TEXT,
    ended_mono DOUBLE PRECISION,
    boot TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE events (
    id BIGSERIAL PRIMARY KEY,
    run TEXT NOT NULL REFERENCES runs(id),
    time TEXT NOT NULL,
    session INTEGER,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE journal_observations (
    id BIGSERIAL PRIMARY KEY,
    time TEXT NOT NULL,
    run TEXT,
    session TEXT,
    env TEXT NOT NULL,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    decision TEXT NOT NULL CHECK (decision IN ('allow', 'deny', 'observe')),
    rule TEXT,
    reason TEXT NOT NULL,
    bytes_up BIGINT NOT NULL DEFAULT 0,
    bytes_down BIGINT NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT '{}',
    cause BIGINT,
    source TEXT,
    local_id BIGINT,
    UNIQUE (source, local_id)
);
CREATE TABLE journal_outcomes (
    observation BIGINT PRIMARY KEY REFERENCES journal_observations(id),
    time TEXT NOT NULL,
    bytes_up BIGINT NOT NULL,
    bytes_down BIGINT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE FUNCTION corral_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the journal is append-only (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER journal_observations_append_only
    BEFORE UPDATE OR DELETE ON journal_observations
    FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER journal_observations_no_truncate
    BEFORE TRUNCATE ON journal_observations
    FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER journal_outcomes_append_only
    BEFORE UPDATE OR DELETE ON journal_outcomes
    FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER journal_outcomes_no_truncate
    BEFORE TRUNCATE ON journal_outcomes
    FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE INDEX runs_claim ON runs (queued_at) WHERE state NOT IN
    ('passed', 'exhausted', 'failed', 'stopped');
""",
    ),
)
SCHEMA_VERSION: Final = MIGRATIONS[-1][0]

_FINAL: Final = ("passed", "exhausted", "failed", "stopped")


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    return pg_connect(url, StoreError, what="the store (--store postgresql)")


def _current_version(conn: psycopg.Connection[tuple[Any, ...]]) -> int | None:
    row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return None
    got = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
    return int(got[0]) if got and got[0] is not None else None


def migrate(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    """Apply the migrations this database lacks; its schema version afterwards.

    A database already at this version is left alone without any DDL, so a
    worker role with no CREATE privilege (see `grant_worker`) can connect."""
    import psycopg

    try:
        have = _current_version(conn)
        if have is not None and have > SCHEMA_VERSION:
            raise StoreError(f"store schema {have} is newer than this corral ({SCHEMA_VERSION})")
        if have == SCHEMA_VERSION:
            return SCHEMA_VERSION
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_MIGRATE,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
                " applied TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            )
            row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
            have = int(row[0]) if row and row[0] is not None else 0
            if have > SCHEMA_VERSION:
                raise StoreError(
                    f"store schema {have} is newer than this corral ({SCHEMA_VERSION})"
                )
            for version, sql in MIGRATIONS:
                if version > have:
                    conn.execute(sql.encode())
                    conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
    except psycopg.Error as exc:
        raise StoreError(f"store migration failed: {exc}") from exc
    return SCHEMA_VERSION


# What a worker does to each table, and no more: the journal and the events
# are append-only by grant (and by trigger); no TRUNCATE, no ownership, so no
# DROP/ALTER of a table or its triggers. FOR SHARE/FOR UPDATE need UPDATE.
WORKER_GRANTS: Final[tuple[tuple[str, LiteralString], ...]] = (
    ("schema_migrations", "SELECT"),
    ("runs", "SELECT, INSERT, UPDATE"),
    ("sessions", "SELECT, INSERT, UPDATE, DELETE"),
    ("session_attempts", "SELECT, INSERT"),
    ("checks", "SELECT, INSERT, UPDATE, DELETE"),
    ("pauses", "SELECT, INSERT, UPDATE"),
    ("events", "SELECT, INSERT"),
    ("journal_observations", "SELECT, INSERT"),
    ("journal_outcomes", "SELECT, INSERT"),
)
_ROLE: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def grant_worker(conn: psycopg.Connection[tuple[Any, ...]], role: str) -> None:
    """As the schema's owner: give `role` exactly `WORKER_GRANTS` (and the sequences
    its inserts draw from), revoking anything else it had on the tables."""
    import psycopg
    from psycopg import sql

    if not _ROLE.fullmatch(role):
        raise UsageError(f"a worker role is a lower-case SQL identifier, not {role[:80]!r}")
    who = sql.Identifier(role)
    try:
        with conn.transaction():
            for table, privileges in WORKER_GRANTS:
                t = sql.Identifier(table)
                conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(t, who))
                conn.execute(sql.SQL("GRANT {} ON {} TO {}").format(sql.SQL(privileges), t, who))
            for seq in ("events_id_seq", "pauses_id_seq", "journal_observations_id_seq"):
                conn.execute(
                    sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(sql.Identifier(seq), who)
                )
    except psycopg.Error as exc:
        raise StoreError(f"granting {role}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Lease:
    """This worker's right to drive one run, until the database's clock passes `expires`."""

    run_id: str
    worker: str
    epoch: int
    takeover: bool


@dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run as the fleet lists it."""

    run: RunRecord
    lease_owner: str | None
    lease_live: bool
    takeovers: int


def _run_record(r: Sequence[Any]) -> RunRecord:
    return run_record(named(RUN_NAMES, r))


def _session_record(r: Sequence[Any]) -> SessionRecord:
    return session_record(named(SESSION_NAMES, r))


class _PgConnection:
    """One connection, serialised by a lock; `_tx()` is one committed transaction.

    `_in_tx` runs first inside every transaction (PgRunStore's lease fence)."""

    def __init__(self, url: str) -> None:
        self._conn = _connect(url)
        self._lock = threading.RLock()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _in_tx(self, c: psycopg.Connection[tuple[Any, ...]]) -> None:
        pass

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        import psycopg

        with self._lock:
            try:
                with self._conn.transaction():
                    self._in_tx(self._conn)
                    yield self._conn
            except psycopg.Error as exc:
                raise StoreError(f"store write failed: {exc}") from exc


class PgFleet(_PgConnection):
    """The shared store: queue, leases, and access to each run's state and journal."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(url)
        try:
            migrate(self._conn)
        except BaseException:
            self._conn.close()
            raise

    def submit(
        self, record: RunRecord, *, files: bytes, git_bundle: bytes, state: str = "queued"
    ) -> None:
        """Queue a run made by `create_run` (its frozen files and its git) for any worker."""
        with self._tx() as c:
            c.execute(
                f"INSERT INTO runs ({RUN_COLS}, files, git_bundle) VALUES"
                " (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)".encode(),
                (
                    record.id,
                    record.mission,
                    state,
                    record.agent,
                    record.provider,
                    record.max_sessions,
                    record.created,
                    now_iso(),
                    None,
                    0,
                    None,
                    record.memory_cap,
                    0,
                    record.base_commit,
                    record.last_commit,
                    files,
                    git_bundle,
                ),
            )
            c.execute(
                "INSERT INTO events (run, time, session, kind, detail) VALUES (%s,%s,%s,%s,%s)",
                (record.id, now_iso(), None, "queued", "{}"),
            )

    def claim(self, worker: str, ttl_s: float, run_id: str | None = None) -> Lease | None:
        """Lease the oldest run nobody drives (or whose driver's lease expired); None if none."""
        only = "AND id = %(id)s" if run_id is not None else ""
        with self._tx() as c:
            row = c.execute(
                f"SELECT id, lease_owner FROM runs WHERE state NOT IN {_FINAL!r} {only}"
                " AND (lease_expires IS NULL OR lease_expires < clock_timestamp())"
                " ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED".encode(),
                {"id": run_id},
            ).fetchone()
            if row is None:
                return None
            takeover = row[1] is not None
            got = c.execute(
                "UPDATE runs SET lease_owner = %s, lease_epoch = lease_epoch + 1,"
                " lease_expires = clock_timestamp() + make_interval(secs => %s),"
                " takeovers = takeovers + %s WHERE id = %s RETURNING lease_epoch",
                (worker, ttl_s, int(takeover), row[0]),
            ).fetchone()
            assert got is not None
            c.execute(
                "INSERT INTO events (run, time, session, kind, detail) VALUES (%s,%s,%s,%s,%s)",
                (
                    row[0],
                    now_iso(),
                    None,
                    "takeover" if takeover else "claimed",
                    json.dumps({"worker": worker, "previous": row[1], "epoch": int(got[0])}),
                ),
            )
        return Lease(run_id=row[0], worker=worker, epoch=int(got[0]), takeover=takeover)

    def renew(self, lease: Lease, ttl_s: float) -> bool:
        """Extend `lease`; False once it is not this worker's (expired, taken or released)."""
        with self._tx() as c:
            row = c.execute(
                "UPDATE runs SET lease_expires = clock_timestamp() + make_interval(secs => %s)"
                " WHERE id = %s AND lease_owner = %s AND lease_epoch = %s"
                " AND lease_expires >= clock_timestamp() RETURNING 1",
                (ttl_s, lease.run_id, lease.worker, lease.epoch),
            ).fetchone()
        return row is not None

    def release(self, lease: Lease) -> None:
        """Give the run back (it is final, or another worker may continue it at once)."""
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET lease_expires = NULL WHERE id = %s AND lease_owner = %s"
                " AND lease_epoch = %s",
                (lease.run_id, lease.worker, lease.epoch),
            )

    def files(self, run_id: str) -> tuple[bytes, bytes]:
        """The run's frozen files (tar) and its latest git bundle."""
        with self._tx() as c:
            row = c.execute(
                "SELECT files, git_bundle FROM runs WHERE id = %s", (run_id,)
            ).fetchone()
        if row is None:
            raise UsageError(f"no run {run_id!r} in the store")
        return bytes(row[0] or b""), bytes(row[1] or b"")

    def runs(self) -> list[QueuedRun]:
        with self._tx() as c:
            rows = c.execute(
                f"SELECT {RUN_COLS}, lease_owner,"
                " coalesce(lease_expires >= clock_timestamp(), false), takeovers"
                " FROM runs ORDER BY queued_at, id".encode()
            ).fetchall()
        return [QueuedRun(_run_record(r[:15]), r[15], bool(r[16]), int(r[17])) for r in rows]

    def attempts(self, run_id: str) -> list[tuple[int, int, str]]:
        """(session, attempt, phase) of every interrupted attempt of a run."""
        with self._tx() as c:
            rows = c.execute(
                "SELECT n, attempt, phase FROM session_attempts WHERE run = %s ORDER BY n, attempt",
                (run_id,),
            ).fetchall()
        return [(int(a), int(b), str(p)) for a, b, p in rows]

    def session_counts(self, run_id: str) -> tuple[int, int]:
        """(sessions that ended, interrupted attempts) of a run."""
        with self._tx() as c:
            row = c.execute(
                "SELECT (SELECT count(*) FROM sessions WHERE run = %s AND state = 'done'),"
                " (SELECT count(*) FROM session_attempts WHERE run = %s)",
                (run_id, run_id),
            ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def run_store(
        self,
        run_id: str,
        lease: Lease | None = None,
        *,
        bundle: Callable[[str], bytes] | None = None,
        mirror: tuple[Path, str] | None = None,
    ) -> PgRunStore:
        return PgRunStore(self.url, run_id, lease, bundle=bundle, mirror=mirror)

    def journal(self) -> PgJournal:
        return PgJournal(self.url)


class PgRunStore(_PgConnection):
    """`RunStateStore` of one run in PostgreSQL; each call one committed transaction.

    `lease`: writes are fenced by it (LeaseLostError once it is not ours).
    `bundle(sha)`: the git bundle stored with each `last_commit`.
    `mirror`: (local SQLite journal, source id) copied into the shared
    journal in the transaction that ends each session and the run.
    """

    def __init__(
        self,
        url: str,
        run_id: str,
        lease: Lease | None = None,
        *,
        bundle: Callable[[str], bytes] | None = None,
        mirror: tuple[Path, str] | None = None,
    ) -> None:
        self.run_id = run_id
        self._lease = lease
        self._bundle = bundle
        self._mirror = mirror
        super().__init__(url)

    def _in_tx(self, c: psycopg.Connection[tuple[Any, ...]]) -> None:
        if self._lease is not None:
            self._fence(c, self._lease)

    @staticmethod
    def _fence(c: psycopg.Connection[tuple[Any, ...]], lease: Lease) -> None:
        row = c.execute(
            "SELECT lease_owner = %s AND lease_epoch = %s AND lease_expires >= clock_timestamp()"
            " FROM runs WHERE id = %s FOR SHARE",
            (lease.worker, lease.epoch, lease.run_id),
        ).fetchone()
        if row is None or not row[0]:
            raise LeaseLostError(f"lease on run {lease.run_id} lost by {lease.worker}")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with self._lock:
            try:
                return self._conn.execute(sql.encode(), params).fetchall()
            except psycopg.Error as exc:
                raise StoreError(f"store read failed: {exc}") from exc

    def _event(
        self, c: psycopg.Connection[tuple[Any, ...]], kind: str, session: int | None, detail: str
    ) -> None:
        c.execute(
            "INSERT INTO events (run, time, session, kind, detail) VALUES (%s,%s,%s,%s,%s)",
            (self.run_id, now_iso(), session, kind, detail),
        )

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
        with self._tx() as c:
            c.execute(
                "INSERT INTO runs (id, mission, state, agent, provider, max_sessions, created,"
                " updated, memory_cap) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                (run_id, mission, "created", agent, provider, max_sessions, t, t, memory_cap),
            )

    def run(self) -> RunRecord:
        rows = self._read(f"SELECT {RUN_COLS} FROM runs WHERE id = %s", (self.run_id,))
        if not rows:
            raise UsageError(f"no run {self.run_id!r} in the store")
        return _run_record(rows[0])

    def update_run(self, **fields: object) -> None:
        bad = set(fields) - RUN_FIELDS
        if bad:
            raise ValueError(f"unknown run fields {sorted(bad)}")
        values = list(fields.values())
        cols = [f"{k} = %s" for k in fields]
        sha = fields.get("last_commit")
        if isinstance(sha, str) and self._bundle is not None:
            # Made before the transaction (git runs for a while); stored in it,
            # so the recorded commit and the bytes that restore it agree.
            cols.append("git_bundle = %s")
            values.append(self._bundle(sha))
        with self._tx() as c:
            c.execute(
                f"UPDATE runs SET {', '.join(cols)}, updated = %s WHERE id = %s".encode(),
                (*values, now_iso(), self.run_id),
            )
            if isinstance(sha, str):
                # The fleet simulation's mid-commit kill: the commit's row is
                # written, its transaction not committed.
                pause_at("commit")
            if fields.get("state") in _FINAL:
                self._mirror_journal(c)

    # -- sessions ---------------------------------------------------------
    def begin_session(self, n: int, phase: str = "agent") -> None:
        with self._tx() as c:
            c.execute(
                "INSERT INTO sessions (run, n, state, phase, started, worker)"
                " VALUES (%s,%s,%s,%s,%s,%s)",
                (
                    self.run_id,
                    n,
                    "running",
                    phase,
                    now_iso(),
                    self._lease.worker if self._lease else None,
                ),
            )
            self._event(c, "session_start", n, "{}")

    def update_session(self, n: int, **fields: object) -> None:
        bad = set(fields) - SESSION_FIELDS
        if bad:
            raise ValueError(f"unknown session fields {sorted(bad)}")
        values = [json.dumps(v) if k == "detail" else v for k, v in fields.items()]
        cols = ", ".join(f"{k} = %s" for k in fields)
        with self._tx() as c:
            c.execute(
                f"UPDATE sessions SET {cols} WHERE run = %s AND n = %s".encode(),
                (*values, self.run_id, n),
            )
            if fields.get("state") == "done":
                self._mirror_journal(c)

    def end_session(self, n: int, *, state: str, end_reason: str, **fields: object) -> None:
        self.update_session(n, state=state, end_reason=end_reason, ended=now_iso(), **fields)

    def sessions(self) -> list[SessionRecord]:
        rows = self._read(
            f"SELECT {SESSION_COLS} FROM sessions WHERE run = %s ORDER BY n", (self.run_id,)
        )
        return [_session_record(r) for r in rows]

    def session(self, n: int) -> SessionRecord | None:
        rows = self._read(
            f"SELECT {SESSION_COLS} FROM sessions WHERE run = %s AND n = %s", (self.run_id, n)
        )
        return _session_record(rows[0]) if rows else None

    def mark_interrupted(self) -> list[int]:
        """Sessions left `running` become attempts; the session number is driven again."""
        out: list[int] = []
        with self._tx() as c:
            rows = c.execute(
                f"SELECT {SESSION_COLS}, worker FROM sessions WHERE run = %s AND state = 'running'"
                " FOR UPDATE".encode(),
                (self.run_id,),
            ).fetchall()
            for r in rows:
                s = _session_record(r[:19])
                got = c.execute(
                    "SELECT coalesce(max(attempt), 0) + 1 FROM session_attempts"
                    " WHERE run = %s AND n = %s",
                    (self.run_id, s.n),
                ).fetchone()
                attempt = int(got[0]) if got else 1
                c.execute(
                    "INSERT INTO session_attempts (run, n, attempt, phase, started, interrupted,"
                    " worker, row) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                    (
                        self.run_id,
                        s.n,
                        attempt,
                        s.phase,
                        s.started,
                        now_iso(),
                        r[19],
                        json.dumps({"tokens": s.tokens, "commit_sha": s.commit_sha}),
                    ),
                )
                c.execute("DELETE FROM checks WHERE run = %s AND session = %s", (self.run_id, s.n))
                c.execute("DELETE FROM sessions WHERE run = %s AND n = %s", (self.run_id, s.n))
                self._event(
                    c,
                    "session_interrupted",
                    s.n,
                    json.dumps({"phase": s.phase, "attempt": attempt, "worker": r[19]}),
                )
                out.append(s.n)
        return out

    # -- pauses -----------------------------------------------------------
    def begin_pause(self, reason: str) -> bool:
        t, mono = now_iso(), time.monotonic()
        with self._tx() as c:
            if c.execute(
                "SELECT 1 FROM pauses WHERE run = %s AND ended IS NULL", (self.run_id,)
            ).fetchone():
                return False
            c.execute(
                "INSERT INTO pauses (run, started, started_mono, boot, reason)"
                " VALUES (%s,%s,%s,%s,%s)",
                (self.run_id, t, mono, _boot_id(), reason),
            )
            c.execute(
                "UPDATE runs SET state = 'paused', updated = %s WHERE id = %s", (t, self.run_id)
            )
            self._event(c, "paused", None, json.dumps({"reason": reason}))
        return True

    def end_pause(self) -> bool:
        t, mono = now_iso(), time.monotonic()
        with self._tx() as c:
            row = c.execute(
                "SELECT id FROM pauses WHERE run = %s AND ended IS NULL", (self.run_id,)
            ).fetchone()
            if row is None:
                return False
            c.execute(
                "UPDATE pauses SET ended = %s, ended_mono = %s WHERE id = %s", (t, mono, row[0])
            )
            c.execute(
                "UPDATE runs SET state = 'running', updated = %s WHERE id = %s"
                " AND state = 'paused'",
                (t, self.run_id),
            )
            self._event(c, "resumed", None, "{}")
        return True

    def paused(self) -> bool:
        return bool(
            self._read("SELECT 1 FROM pauses WHERE run = %s AND ended IS NULL", (self.run_id,))
        )

    def pause_intervals(self) -> list[tuple[float, float | None]]:
        rows = self._read(
            "SELECT started_mono, ended_mono FROM pauses WHERE run = %s AND boot = %s ORDER BY id",
            (self.run_id, _boot_id()),
        )
        return [pause_interval(r) for r in rows]

    def paused_s(self, since: float, now: float) -> float:
        return paused_seconds(self.pause_intervals(), since, now)

    # -- checks -----------------------------------------------------------
    def record_checks(self, n: int, results: list[CheckResult]) -> None:
        with self._tx() as c:
            for i, r in enumerate(results):
                c.execute(
                    "INSERT INTO checks (run, session, name, ord, passed, reason, exit,"
                    " duration_s, output) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)"
                    " ON CONFLICT (run, session, name) DO UPDATE SET ord = EXCLUDED.ord,"
                    " passed = EXCLUDED.passed, reason = EXCLUDED.reason, exit = EXCLUDED.exit,"
                    " duration_s = EXCLUDED.duration_s, output = EXCLUDED.output",
                    (
                        self.run_id,
                        n,
                        r.name,
                        i,
                        int(r.passed),
                        r.reason,
                        r.exit,
                        r.duration_s,
                        r.output[-4000:],
                    ),
                )
            c.execute(
                "UPDATE sessions SET checks_passed = %s, checks_total = %s"
                " WHERE run = %s AND n = %s",
                (sum(1 for r in results if r.passed), len(results), self.run_id, n),
            )

    def checks(self, n: int) -> list[CheckResult]:
        rows = self._read(
            "SELECT name, passed, reason, exit, duration_s, output FROM checks"
            " WHERE run = %s AND session = %s ORDER BY ord",
            (self.run_id, n),
        )
        return [check_result(r) for r in rows]

    # -- events -----------------------------------------------------------
    def event(self, kind: str, session: int | None = None, **detail: object) -> None:
        with self._tx() as c:
            self._event(c, kind, session, json.dumps(detail, default=str))

    def events(self) -> list[tuple[str, int | None, str, dict[str, Any]]]:
        rows = self._read(
            "SELECT time, session, kind, detail FROM events WHERE run = %s ORDER BY id",
            (self.run_id,),
        )
        return [event_row(r) for r in rows]

    def integrity_ok(self) -> bool:
        return bool(self._read("SELECT 1 FROM runs WHERE id = %s", (self.run_id,)))

    # -- journal mirror ---------------------------------------------------
    def mirror_journal(self) -> int:
        """Copy the local journal's new rows into the shared one; how many were new."""
        with self._tx() as c:
            return self._mirror_journal(c)

    def _mirror_journal(self, c: psycopg.Connection[tuple[Any, ...]]) -> int:
        if self._mirror is None or not self._mirror[0].is_file():
            return 0
        return mirror_rows(c, self._mirror[0], self._mirror[1])


def mirror_rows(c: psycopg.Connection[tuple[Any, ...]], path: Path, source: str) -> int:
    """Insert the rows of SQLite journal `path` not yet in the shared journal (by local id).

    Brokers commit their rows to both journals as they go (corral.broker.pgjournal), so
    the rows already there need not be contiguous: every missing id is copied, not just
    those above the highest."""
    have = {
        int(r[0])
        for r in c.execute(
            "SELECT local_id FROM journal_observations WHERE source = %s", (source,)
        ).fetchall()
    }
    src = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=10.0)
    try:
        rows = [
            r
            for r in src.execute(
                "SELECT id, time, run, session, env, kind, target, decision, rule, reason,"
                " bytes_up, bytes_down, detail, cause FROM observations ORDER BY id"
            ).fetchall()
            if int(r[0]) not in have
        ]
        outcomes = src.execute(
            "SELECT observation, time, bytes_up, bytes_down, detail FROM outcomes"
        ).fetchall()
    finally:
        src.close()
    for r in rows:
        c.execute(
            "INSERT INTO journal_observations (time, run, session, env, kind, target, decision,"
            " rule, reason, bytes_up, bytes_down, detail, cause, source, local_id)"
            " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
            " ON CONFLICT (source, local_id) DO NOTHING",
            (*r[1:], source, r[0]),
        )
    for o in outcomes:
        c.execute(
            "INSERT INTO journal_outcomes (observation, time, bytes_up, bytes_down, detail)"
            " SELECT id, %s, %s, %s, %s FROM journal_observations"
            " WHERE source = %s AND local_id = %s ON CONFLICT (observation) DO NOTHING",
            (*o[1:], source, o[0]),
        )
    return len(rows)


class PgJournal(_PgConnection):
    """`JournalSink` on PostgreSQL: `commit()` returns once the rows are committed."""

    def commit(
        self, observations: Sequence[tuple[Any, ...]], outcomes: Sequence[tuple[Any, ...]]
    ) -> list[int]:
        import psycopg

        from corral.errors import JournalError

        ids: list[int] = []
        with self._lock:
            try:
                with self._conn.transaction():
                    for row in observations:
                        got = self._conn.execute(
                            "INSERT INTO journal_observations (time, run, session, env, kind,"
                            " target, decision, rule, reason, bytes_up, bytes_down, detail, cause)"
                            " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING id",
                            row,
                        ).fetchone()
                        assert got is not None
                        ids.append(int(got[0]))
                    for row in outcomes:
                        self._conn.execute(
                            "INSERT INTO journal_outcomes (observation, time, bytes_up,"
                            " bytes_down, detail) VALUES (%s,%s,%s,%s,%s)"
                            " ON CONFLICT (observation) DO NOTHING",
                            row,
                        )
            except psycopg.Error as exc:
                raise JournalError(f"journal write failed: {exc}") from exc
        return ids

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement as the journal's role (tests use it to try UPDATE/DELETE)."""
        import psycopg

        from corral.errors import JournalError

        with self._lock:
            try:
                cur = self._conn.execute(sql.encode(), params)
                return cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                raise JournalError(f"journal statement refused: {exc}") from exc
