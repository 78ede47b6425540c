"""Append-only by grants: the worker role cannot rewrite, truncate or unprotect the journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import JournalError
from corral.run.store import RunRecord
from corral.store.postgres import PgFleet
from tests.integration.run.helpers import corral
from tests.integration.store.conftest import PgServer, fresh_owned_db

pytestmark = [pytest.mark.requires_postgresql]

_ATTACKS = (
    "UPDATE journal_observations SET decision = 'deny'",
    "DELETE FROM journal_observations",
    "DELETE FROM journal_outcomes",
    "UPDATE journal_outcomes SET bytes_up = 0",
    "TRUNCATE journal_observations",
    "TRUNCATE journal_outcomes CASCADE",
    "DROP TRIGGER journal_observations_append_only ON journal_observations",
    "ALTER TABLE journal_observations DISABLE TRIGGER USER",
    "DROP TABLE journal_outcomes",
    "DELETE FROM events",
    "UPDATE events SET kind = 'forged'",
    "CREATE TABLE journal_shadow (x int)",
)


def _obs(run: str) -> tuple[object, ...]:
    return (
        "t",
        run,
        "1",
        "agent",
        "net_connect",
        "example:443",
        "deny",
        None,
        "r",
        0,
        0,
        "{}",
        None,
    )


def _record(rid: str) -> RunRecord:
    return RunRecord(
        rid, "m", "created", "script", "synthetic", 3, "t", "t", None, False, None, 1 << 20, 0,
        "base", "base",
    )  # fmt: skip


def test_worker_role_cannot_rewrite_or_unprotect_the_journal(pg_worker: tuple[str, str]) -> None:
    owner_url, worker_url = pg_worker
    # The worker does its whole job under its grants: queue, lease, state, journal.
    with PgFleet(worker_url) as f:
        f.submit(_record("r1"), files=b"", git_bundle=b"")
        lease = f.claim("w", 30)
        assert lease is not None
        st = f.run_store("r1", lease)
        st.begin_session(1)
        st.update_session(1, phase="verify")
        st.mark_interrupted()
        st.event("x")
        st.close()
        j = f.journal()
        [oid] = j.commit([_obs("r1")], [])
        j.commit([], [(oid, "t", 1, 2, "{}")])
        for attack in _ATTACKS:
            with pytest.raises(JournalError, match=r"permission denied|must be owner"):
                j.execute(attack)
        j.close()
    with PgFleet(owner_url) as f:
        j = f.journal()
        assert j.execute("SELECT count(*) FROM journal_observations") == [(1,)]
        assert j.execute("SELECT count(*) FROM journal_outcomes") == [(1,)]
        assert j.execute("SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal") == [(4,)]
        # Control: the owner role can unprotect the journal, which is why workers must not
        # connect as it.
        j.execute("DROP TRIGGER journal_observations_append_only ON journal_observations")
        j.close()
    with PgFleet(worker_url) as f:
        j = f.journal()
        with pytest.raises(JournalError, match="permission denied"):
            j.execute("DELETE FROM journal_observations")  # the grant holds without the trigger
        j.close()


def test_store_init_grants_through_the_cli(pg_server: PgServer, tmp_path: Path) -> None:
    db = fresh_owned_db(pg_server)
    owner = pg_server.url(db, "corral_owner")
    r = corral("store-init", "--store", owner, "--worker-role", "corral_worker", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with PgFleet(pg_server.url(db, "corral_worker")) as f:
        j = f.journal()
        with pytest.raises(JournalError, match="permission denied"):
            j.execute("TRUNCATE journal_observations")
        j.close()
    r = corral("store-init", "--store", owner, "--worker-role", "Bad;Role", cwd=tmp_path)
    assert r.returncode == 2 and "worker role" in r.stderr
