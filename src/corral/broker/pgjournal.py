"""The journal of a fleet run: each commit in the run directory's SQLite and in PostgreSQL.

    journal = open_journal(path)   # Journal, or TeeJournal when the worker set the variables

A worker driving a run from a PostgreSQL store sets `CORRAL_JOURNAL_STORE`
(the store's URL) and `CORRAL_JOURNAL_SOURCE` (this driver's journal source
id) in its own environment, which every broker of the run inherits (host
processes only: a sandbox's environment is built from the spec, never
inherited). `TeeJournal.commit` commits the rows to the local SQLite file
(the copy the coordinator counts and reports from, and the row ids outcomes
refer to), then to `journal_observations`/`journal_outcomes` keyed by
(source, local id), and returns only after both: an observation is in the
shared store before the action it allows, so a host lost with its run
directory loses no acknowledged row. A PostgreSQL failure raises
JournalError: the caller denies the action (fail closed). A row committed
locally whose PostgreSQL commit never came was never acknowledged; the
session-end mirror (corral.store.postgres.mirror_rows) copies it later under
the same key, never twice.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from corral.broker.journal import Journal
from corral.errors import CorralError, JournalError

if TYPE_CHECKING:
    import psycopg

__all__ = ["ENV_SOURCE", "ENV_STORE", "TeeJournal", "open_journal", "pg_connect"]

ENV_STORE: Final = "CORRAL_JOURNAL_STORE"
ENV_SOURCE: Final = "CORRAL_JOURNAL_SOURCE"

_INSERT_OBS: Final = (
    "INSERT INTO journal_observations (time, run, session, env, kind, target, decision, rule,"
    " reason, bytes_up, bytes_down, detail, cause, source, local_id)"
    " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
    " ON CONFLICT (source, local_id) DO NOTHING"
)
_INSERT_OUTCOME: Final = (
    "INSERT INTO journal_outcomes (observation, time, bytes_up, bytes_down, detail)"
    " SELECT id, %s, %s, %s, %s FROM journal_observations WHERE source = %s AND local_id = %s"
    " ON CONFLICT (observation) DO NOTHING"
)


class TeeJournal(Journal):
    """A `Journal` whose every commit is also committed to the shared PostgreSQL journal."""

    def __init__(
        self,
        path: str | Path,
        url: str,
        source: str,
        synchronous: Literal["normal", "full"] = "normal",
    ) -> None:
        super().__init__(path, synchronous)
        self.source = source
        self._remote_lock = threading.Lock()
        try:
            self._remote: psycopg.Connection[tuple[Any, ...]] | None = _connect(url)
        except BaseException:
            super().close()
            raise

    def commit(
        self, observations: Sequence[tuple[Any, ...]], outcomes: Sequence[tuple[Any, ...]]
    ) -> list[int]:
        import psycopg

        ids = super().commit(observations, outcomes)
        with self._remote_lock:
            conn = self._remote
            if conn is None:
                raise JournalError(f"journal {self.path}: the shared journal is closed")
            try:
                with conn.transaction(), conn.cursor() as cur:
                    if observations:
                        cur.executemany(
                            _INSERT_OBS,
                            [
                                (*row, self.source, i)
                                for row, i in zip(observations, ids, strict=True)
                            ],
                        )
                    if outcomes:
                        cur.executemany(
                            _INSERT_OUTCOME, [(*o[1:], self.source, o[0]) for o in outcomes]
                        )
            except psycopg.Error as exc:
                raise JournalError(f"shared journal write failed: {exc}") from exc
        return ids

    def close(self) -> None:
        with self._remote_lock:
            if self._remote is not None:
                self._remote.close()
                self._remote = None
        super().close()


def pg_connect(
    url: str, fail: Callable[[str], CorralError], *, what: str
) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection to `url` (10 s to connect); `fail(message)` is
    raised when psycopg is missing or the server cannot be reached. The fleet
    store (corral.store.postgres) connects the same way."""
    try:
        import psycopg
    except ImportError as exc:
        raise fail(f"{what} needs psycopg: install corral[postgresql]") from exc
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise fail(f"cannot reach {what}: {exc}".strip()) from exc


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    return pg_connect(url, JournalError, what="the shared journal")


def open_journal(
    path: str | Path,
    synchronous: Literal["normal", "full"] = "normal",
    environ: Mapping[str, str] | None = None,
) -> Journal:
    """The run's journal: a `TeeJournal` when the environment names a shared one."""
    env = os.environ if environ is None else environ
    url, source = env.get(ENV_STORE), env.get(ENV_SOURCE)
    if not url:
        return Journal(path, synchronous)
    if not source:
        raise JournalError(f"${ENV_STORE} is set without ${ENV_SOURCE}")
    return TeeJournal(path, url, source, synchronous)
