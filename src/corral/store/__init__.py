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
from typing import TYPE_CHECKING

from corral.errors import UsageError
from corral.run.store_api import JournalSink, RunStateStore

if TYPE_CHECKING:
    from corral.store.postgres import PgFleet

__all__ = ["JournalSink", "RunStateStore", "open_fleet", "store_url"]


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
