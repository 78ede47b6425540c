"""Fleet simulation: 3 workers (processes) share one PostgreSQL; 12 queued runs; three workers
are SIGKILLed (one mid-commit, one mid-session, one mid-check) and replaced. Every run must end
exactly once,
every session be counted once (the killed attempt recorded as an attempt), no journal row be
lost or duplicated, and nothing of any run be left on the host.

The kill points are chosen from the store's own state (a session of the victim's leased run in
the agent / verify phase), never from elapsed time; the mid-commit victim blocks on a FIFO inside
the transaction that records its session's commit (`CORRAL_TEST_PAUSE_AT=commit`, host-side
test hook) and is killed there. Takeover time and runs/minute are printed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from corral.errors import CorralError
from corral.run.runcg import RunCgroup
from corral.store.postgres import PgFleet
from corral.store.testhook import ENV_FIFO, ENV_POINT
from tests.integration.run.helpers import corral, corral_argv, new_id

pytestmark = [pytest.mark.requires_postgresql, pytest.mark.requires_sandbox, pytest.mark.slow]

SCENARIO = """name: fleet
turns: [{say: "nothing scripted"}]
conversations:
  - prompt: "(?m)^Session 1 of"
    turns:
      - calls: [{shell: "sleep 1; echo yes > fixed"}]
      - say: "fixed"
"""

MISSION = """+++
agent = "script"
provider = "synthetic:scenario.yaml"
max_sessions = 3

[session]
wall_time = "60s"

[limits]
run_memory = "1G"
agent = { memory = "512M", pids = 256 }
verifier = { memory = "256M", pids = 64 }

[[checks]]
name = "fixed"
run = "sleep 2; test -f fixed"
timeout = "30s"
+++
# A file called `fixed`

Create a file `fixed` containing `yes`.
"""

LEASE_S = 3.0
RUNS = 12


@pytest.fixture
def run_ids() -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    for rid in ids:
        cg = RunCgroup.detect(rid)
        if cg is not None and cg.exists():
            with contextlib.suppress(CorralError, OSError):
                cg.sweep()


def _worker(
    url: str, work_dir: Path, log: Path, pause_fifo: Path | None = None
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).parents[3] / "src")
    if pause_fifo is not None:
        env.update({ENV_POINT: "commit", ENV_FIFO: str(pause_fifo)})
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                *corral_argv(
                    "worker",
                    "--store",
                    url,
                    "--plain",
                    "--lease",
                    str(LEASE_S),
                    "--idle-exit",
                    "6",
                    "--work-dir",
                    str(work_dir),
                )
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _wait_paused(fifo: Path, proc: subprocess.Popen[bytes]) -> int:
    """Block until `proc` opened the FIFO for reading (it stands at its pause point); our end."""
    deadline = time.monotonic() + 180
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        assert proc.poll() is None, "the paused worker exited"
        assert time.monotonic() < deadline, "the worker never reached its commit"
        time.sleep(0.02)


def _leased_by(fleet: PgFleet, pid: int) -> str:
    j = fleet.journal()
    try:
        rows = j.execute("SELECT id, lease_owner FROM runs WHERE lease_owner IS NOT NULL")
    finally:
        j.close()
    [rid] = [str(r) for r, owner in rows if int(str(owner).split(":")[1]) == pid and r]
    return rid


def _leased_in_phase(
    fleet: PgFleet, phase: str, spare: frozenset[str] = frozenset()
) -> tuple[int, str] | None:
    """(worker pid, run) of a live lease whose run (not in `spare`) has a session in `phase`."""
    j = fleet.journal()
    try:
        rows = j.execute(
            "SELECT r.lease_owner, r.id FROM runs r JOIN sessions s ON s.run = r.id"
            " WHERE s.state = 'running' AND s.phase = %s AND r.lease_expires > clock_timestamp()",
            (phase,),
        )
    finally:
        j.close()
    for owner, rid in rows:
        if str(rid) not in spare:
            return int(str(owner).split(":")[1]), str(rid)
    return None


def _processes_naming(path: Path) -> list[int]:
    """Live processes whose command line mentions `path`."""
    needle = os.fsencode(str(path))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if needle in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_fleet_survives_three_worker_kills(tmp_path: Path, pg_url: str, run_ids: list[str]) -> None:
    mdir = tmp_path / "mission"
    mdir.mkdir()
    (mdir / "scenario.yaml").write_text(SCENARIO)
    (mdir / "MISSION.md").write_text(MISSION)
    for _ in range(RUNS):
        rid = new_id()
        run_ids.append(rid)
        r = corral("submit", str(mdir / "MISSION.md"), "--store", pg_url, "--id", rid, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    work = tmp_path / "host-work"  # one host: every worker materializes runs here
    logs = tmp_path / "logs"
    logs.mkdir()
    started = time.monotonic()
    fifo = tmp_path / "pause-at-commit"
    os.mkfifo(fifo, 0o600)
    workers = [
        _worker(pg_url, work, logs / f"w{k}.log", fifo if k == 0 else None) for k in range(3)
    ]
    kills: list[tuple[str, str, datetime]] = []  # (run, phase at the kill, when)
    fleet = PgFleet(pg_url)
    try:
        # Mid-commit: worker 0 stands inside the transaction recording its first commit.
        victim = workers[0]
        end = _wait_paused(fifo, victim)
        rid = _leased_by(fleet, victim.pid)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        os.close(end)
        kills.append((rid, "product", datetime.now(UTC)))  # the session's phase after its commit
        workers.remove(victim)
        workers.append(_worker(pg_url, work, logs / "r0.log"))
        for phase in ("agent", "verify"):
            deadline = time.monotonic() + 120
            killed = frozenset(k[0] for k in kills)  # each run is killed at most once
            while (hit := _leased_in_phase(fleet, phase, killed)) is None:
                assert time.monotonic() < deadline, f"no session ever reached {phase}"
                time.sleep(0.05)
            pid, rid = hit
            victim = next(w for w in workers if w.pid == pid)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            kills.append((rid, phase, datetime.now(UTC)))
            # A fleet replaces a dead worker; the takeover itself waits for the lease expiry.
            workers.remove(victim)
            workers.append(_worker(pg_url, work, logs / f"r{len(kills)}.log"))
        for w in workers:
            assert w.wait(240) == 0, (logs / "w0.log").read_text()[-2000:]
        elapsed = time.monotonic() - started

        runs = {q.run.id: q for q in fleet.runs()}
        j = fleet.journal()
        try:
            ends = dict(
                j.execute("SELECT run, count(*) FROM events WHERE kind = 'run_end' GROUP BY run")
            )
            dup = j.execute(
                "SELECT source, local_id FROM journal_observations GROUP BY source, local_id"
                " HAVING count(*) > 1"
            )
            gaps = j.execute(
                "SELECT source, count(*), max(local_id) FROM journal_observations"
                " GROUP BY source HAVING count(*) <> max(local_id)"
            )
            takeover_at = dict(
                j.execute("SELECT run, min(time) FROM events WHERE kind = 'takeover' GROUP BY run")
            )
        finally:
            j.close()
        # Every run ended exactly once, in a final state.
        assert sorted(runs) == sorted(run_ids)
        assert {q.run.state for q in runs.values()} == {"passed"}, {
            r: (q.run.state, q.run.end_reason) for r, q in runs.items()
        }
        assert all(ends.get(rid) == 1 for rid in run_ids), ends
        # Every session counted once; the killed ones are attempts of the same number.
        for rid in run_ids:
            st = fleet.run_store(rid)
            ss = st.sessions()
            st.close()
            assert [(s.n, s.state) for s in ss] == [(1, "done")], (rid, ss)
        for rid, phase, _ in kills:
            assert fleet.attempts(rid) == [(1, 1, phase)]
            assert runs[rid].takeovers == 1
        # The shared journal: no row twice, none missing from any source's sequence.
        assert dup == [] and gaps == []
        # Nothing of any run left on the host.
        for rid in run_ids:
            cg = RunCgroup.detect(rid)
            assert cg is None or not cg.exists() or not cg.pids(), rid
        assert _processes_naming(work) == []  # brokers, sandboxes of the killed workers too
        takeovers = [
            (datetime.fromisoformat(str(takeover_at[rid])) - when).total_seconds()
            for rid, _, when in kills
        ]
        report = {
            "runs": RUNS,
            "elapsed_s": round(elapsed, 1),
            "runs_per_minute": round(RUNS / elapsed * 60, 2),
            "lease_s": LEASE_S,
            "takeover_s": [round(t, 2) for t in takeovers],
        }
        sys.stderr.write(f"fleet: {json.dumps(report)}\n")
        (tmp_path.parent / "fleet-report.json").write_text(json.dumps(report))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        fleet.close()
