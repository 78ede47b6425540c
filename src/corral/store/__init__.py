"""One interface for run state and the journal; SQLite (embedded) or PostgreSQL (a fleet).

    store = open_fleet("postgresql:///corral?host=/run/pg")   # FleetStore
    rs = store.run_store(run_id, lease)                        # RunStateStore of one run

`RunStateStore` is what the coordinator writes (runs, sessions, checks,
pauses, events): `corral.run.store.Store` is its SQLite implementation (one
file per run, WAL) and `corral.store.postgres.PgRunStore` the PostgreSQL
one. `JournalSink` is the journal's write side (`corral.broker.journal.Journal`
on SQLite, `PgJournal`), append-only in both. Every method is one committed
transaction: an observation is durable before the action it allows.

`FleetStore` adds the queue and the leases a fleet of workers shares
(PostgreSQL only: an embedded SQLite run is driven under its flock).
The implementation is chosen by the URL's scheme, imported lazily.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from corral.errors import UsageError

if TYPE_CHECKING:
    from corral.run.store import CheckResult, RunRecord, SessionRecord
    from corral.store.postgres import PgFleet

__all__ = ["JournalSink", "RunStateStore", "open_fleet", "store_url"]


class RunStateStore(Protocol):
    """The durable state of one run (see corral.run.store for the states)."""

    def create_run(
        self,
        run_id: str,
        *,
        mission: str,
        agent: str,
        provider: str,
        max_sessions: int,
        memory_cap: int,
    ) -> None: ...
    def run(self) -> RunRecord: ...
    def update_run(self, **fields: object) -> None: ...
    def begin_session(self, n: int, phase: str = "agent") -> None: ...
    def update_session(self, n: int, **fields: object) -> None: ...
    def end_session(self, n: int, *, state: str, end_reason: str, **fields: object) -> None: ...
    def sessions(self) -> list[SessionRecord]: ...
    def session(self, n: int) -> SessionRecord | None: ...
    def mark_interrupted(self) -> list[int]: ...
    def begin_pause(self, reason: str) -> bool: ...
    def end_pause(self) -> bool: ...
    def paused(self) -> bool: ...
    def pause_intervals(self) -> list[tuple[float, float | None]]: ...
    def paused_s(self, since: float, now: float) -> float: ...
    def record_checks(self, n: int, results: list[CheckResult]) -> None: ...
    def checks(self, n: int) -> list[CheckResult]: ...
    def event(self, kind: str, session: int | None = None, **detail: object) -> None: ...
    def events(self) -> list[tuple[str, int | None, str, dict[str, Any]]]: ...
    def close(self) -> None: ...


class JournalSink(Protocol):
    """The journal's write side: rows from `observation_row`/`outcome_row`."""

    def commit(
        self, observations: Sequence[tuple[Any, ...]], outcomes: Sequence[tuple[Any, ...]]
    ) -> list[int]: ...
    def close(self) -> None: ...


def store_url(option: str | None) -> str | None:
    """`--store` if given, else `CORRAL_STORE`; None means the embedded SQLite default."""
    url = option if option is not None else os.environ.get("CORRAL_STORE") or None
    if url is not None and not url.startswith(("postgresql://", "postgres://", "sqlite:")):
        raise UsageError(f"--store: expected postgresql://… or sqlite:, got {url[:80]!r}")
    if url is not None and url.startswith("sqlite:"):
        return None
    return url


def open_fleet(url: str) -> PgFleet:
    """The shared store at `url` (postgresql://…), schema migrated to the current version."""
    from corral.store.postgres import PgFleet

    return PgFleet(url)
