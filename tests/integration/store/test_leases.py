"""PostgreSQL leases: one driver per run, takeover after expiry, fencing, exactly-once sessions."""

from __future__ import annotations

import threading
import time

import pytest

from corral.errors import LeaseLostError
from corral.run.store import RunRecord
from corral.store.postgres import Lease, PgFleet

pytestmark = [pytest.mark.requires_postgresql]


def _queue(fleet: PgFleet, n: int) -> list[str]:
    ids = []
    for i in range(n):
        rid = f"run{i:02d}"
        rec = RunRecord(
            rid,
            "m",
            "created",
            "script",
            "synthetic",
            3,
            "t",
            "t",
            None,
            False,
            None,
            1 << 20,
            0,
            "base",
            "base",
        )
        fleet.submit(rec, files=b"", git_bundle=b"")
        ids.append(rid)
    return ids


def _wait_claim(fleet: PgFleet, worker: str, ttl: float, run_id: str) -> Lease:
    """Claim once the database's clock passed the old lease; the deadline only bounds a failure."""
    deadline = time.monotonic() + 30
    while (got := fleet.claim(worker, ttl, run_id)) is None:
        assert time.monotonic() < deadline, "the expired lease was never claimable"
        time.sleep(0.05)
    return got


def test_concurrent_claims_are_disjoint(pg_url: str) -> None:
    with PgFleet(pg_url) as f:
        ids = _queue(f, 12)
    claimed: list[list[str]] = [[] for _ in range(4)]

    def claimer(k: int) -> None:
        with PgFleet(pg_url) as f:
            while (lease := f.claim(f"w{k}", 60)) is not None:
                claimed[k].append(lease.run_id)

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [r for c in claimed for r in c]
    assert sorted(every) == ids  # each run leased exactly once while the leases live


def test_expired_lease_is_taken_over_and_the_old_driver_fenced(pg_url: str) -> None:
    with PgFleet(pg_url) as f:
        [rid] = _queue(f, 1)
        a = f.claim("A", 0.5)
        assert a is not None and not a.takeover
        assert f.claim("B", 30) is None  # live lease: nobody else
        old = f.run_store(rid, a)
        old.begin_session(1)
        b = _wait_claim(f, "B", 30, rid)
        assert b.takeover and b.epoch == a.epoch + 1
        # The stalled driver wakes up: every write is refused, its lease cannot be renewed.
        with pytest.raises(LeaseLostError):
            old.update_run(state="passed", end_reason="forged by the old driver")
        with pytest.raises(LeaseLostError):
            old.event("late")
        assert not f.renew(a, 30)
        old.close()
        new = f.run_store(rid, b)
        assert new.run().state != "passed"
        assert f.renew(b, 30)
        new.close()


def test_interrupted_session_is_driven_again_under_its_number(pg_url: str) -> None:
    with PgFleet(pg_url) as f:
        [rid] = _queue(f, 1)
        a = f.claim("A", 0.3)
        assert a is not None
        s = f.run_store(rid, a)
        s.begin_session(1)
        s.end_session(1, state="done", end_reason="ok", tokens=10)
        s.begin_session(2)
        s.update_session(2, phase="verify", tokens=5)
        s.close()  # worker A dies here, mid-check
        b = _wait_claim(f, "B", 30, rid)
        s = f.run_store(rid, b)
        assert s.mark_interrupted() == [2]
        assert [x.n for x in s.sessions()] == [1]
        assert f.attempts(rid) == [(2, 1, "verify")]
        s.begin_session(2)
        s.end_session(2, state="done", end_reason="ok", tokens=6)
        assert [(x.n, x.tokens) for x in s.sessions()] == [(1, 10), (2, 6)]
        kinds = [e[2] for e in s.events()]
        assert kinds.count("session_interrupted") == 1 and "takeover" in kinds
        s.close()
