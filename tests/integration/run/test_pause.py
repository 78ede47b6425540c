"""`corral pause` / `corral resume` / `corral stop` on a live run, judged by host counters.

The agent of session 1 writes a counter to a heartbeat file in the workspace
every 50 ms; a paused run must leave that file and the run cgroup's CPU time
exactly where they were, whatever the interval.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from corral.run.store import RunLock, Store
from tests.integration.run.helpers import (
    alive,
    corral,
    in_phase,
    new_id,
    run_cgroup,
    sessions,
    start_corral,
    wait_for,
    write_mission,
)

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(90)]

# Session 1: 60 beats, then the file session 2's checks need is not there yet.
_BEATS = (
    "i=0; while [ $i -lt BEATS ]; do i=$((i+1)); echo $i > hb; sleep 0.05; done; echo one > stage1"
)


def _mission(tmp_path: Path, beats: int) -> Path:
    mission = write_mission(tmp_path / "m")
    scen = tmp_path / "m" / "scenario.yaml"
    text = scen.read_text().replace(
        "sleep 0; echo one > stage1", _BEATS.replace("BEATS", str(beats))
    )
    scen.write_text(text)
    return mission


def _start(tmp_path: Path, beats: int) -> tuple[str, Path, subprocess.Popen[bytes]]:
    rid = new_id()
    proc = start_corral(
        "run", str(_mission(tmp_path, beats)), "--plain", "--id", rid,
        "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path,
    )  # fmt: skip
    return rid, tmp_path / "runs" / rid, proc


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return corral(*args, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)


def _beat(run_dir: Path) -> int:
    try:
        return int((run_dir / "workspace" / "hb").read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _pause_when_beating(tmp_path: Path, rid: str, run_dir: Path) -> None:
    wait_for(lambda: in_phase(run_dir, 1, "agent"), 40, "session 1 agent")
    wait_for(lambda: _beat(run_dir) >= 2, 40, "the heartbeat")
    result = _cli(tmp_path, "pause", rid)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "paused" in result.stdout
    # Durable before acknowledged: the state is already on disk.
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "paused" and s.paused()


def _assert_no_progress(rid: str, run_dir: Path) -> None:
    cg = run_cgroup(rid)
    cpu0, beat0 = cg.cgroup.usage().cpu_s, _beat(run_dir)
    # Long enough for 20 beats of a running agent; the verdict is the counters.
    time.sleep(1.0)
    assert cg.cgroup.usage().cpu_s == cpu0, "the run used CPU while paused"
    assert _beat(run_dir) == beat0, "the heartbeat moved while paused"


def _assert_top_and_status_while_paused(tmp_path: Path, rid: str) -> None:
    top = _cli(tmp_path, "top", "--once", "--json")
    assert top.returncode == 0, top.stderr
    rows = {r["env"]: r for r in map(json.loads, top.stdout.splitlines()) if r["run"] == rid}
    assert rows["run"]["memory_cap_bytes"] == 1 << 30
    assert 0 < rows["run"]["memory_bytes"] <= rows["run"]["memory_peak_bytes"]
    assert rows["run"]["pids"] >= 2 and "agent" in rows
    # Frozen: the kernel's CPU counter did not move between top's two samples.
    assert rows["run"]["cpu_percent"] == 0.0
    plain = _cli(tmp_path, "top", "--once")
    assert plain.returncode == 0 and max(map(len, plain.stdout.splitlines())) <= 80
    st = _cli(tmp_path, "status", rid, "--json")
    fp = json.loads(st.stdout)["footprint"]
    assert fp["memory_cap_bytes"] == 1 << 30 and fp["memory_peak_bytes"] > 0
    assert fp["cpu_s"] > 0 and fp["watchdog"] == []


def test_a_paused_run_makes_no_progress_and_completes_after_resume(tmp_path: Path) -> None:
    # 6 s of beats: `corral pause` (a CLI start on a loaded host) lands mid-way.
    rid, run_dir, proc = _start(tmp_path, beats=120)
    try:
        _pause_when_beating(tmp_path, rid, run_dir)
        assert _beat(run_dir) < 120, "the agent finished before the pause landed"
        _assert_no_progress(rid, run_dir)
        _assert_top_and_status_while_paused(tmp_path, rid)
        result = _cli(tmp_path, "resume", rid)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "resumed" in result.stdout
        # `resume` of a live run returns while the run still has beats to go
        # (it did not wait for the run); the coordinator continues.
        assert proc.poll() is None
        wait_for(lambda: _beat(run_dir) == 120, 40, "the heartbeat to continue to its end")
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ss = sessions(run_dir)
    # Session 1 continued where it was (its agent finished, not restarted).
    assert ss[0].state == "done" and ss[0].end_reason == "agent finished"
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "passed"
        ((start, end),) = s.pause_intervals()
        assert end is not None and end > start
    # The report links the plot drawn from the watchdog's samples.
    assert "](footprint.svg)" in (run_dir / "report.md").read_text()
    assert "<svg" in (run_dir / "footprint.svg").read_text()


def test_sigkill_of_the_coordinator_while_paused_then_resume_continues(tmp_path: Path) -> None:
    rid, run_dir, proc = _start(tmp_path, beats=400)
    try:
        _pause_when_beating(tmp_path, rid, run_dir)
        pids = run_cgroup(rid).pids()
        assert pids
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: not RunLock.is_held(run_dir), 3, "the run lock to be free")
    # Still frozen and still paused on disk: nothing ran on without its coordinator.
    _assert_no_progress(rid, run_dir)
    st = _cli(tmp_path, "status", rid, "--json")
    assert '"state": "paused, coordinator gone (resume it)"' in st.stdout
    result = corral("resume", rid, "--plain", "--runs-dir", str(tmp_path / "runs"),
                    cwd=tmp_path, timeout=90)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert not any(alive(p) for p in pids)
    assert not run_cgroup(rid).exists()
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "passed" and not s.paused()
    ss = sessions(run_dir)
    assert ss[0].state == "interrupted" and ss[-1].checks_passed == ss[-1].checks_total == 2


def test_stop_ends_a_paused_run_with_nothing_left(tmp_path: Path) -> None:
    rid, run_dir, proc = _start(tmp_path, beats=400)
    try:
        _pause_when_beating(tmp_path, rid, run_dir)
        pids = run_cgroup(rid).pids()
        beat = _beat(run_dir)
        result = _cli(tmp_path, "stop", rid)
        assert result.returncode == 0, result.stdout + result.stderr
        assert proc.wait(20) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any(alive(p) for p in pids), "a process of the paused run survived stop"
    assert not run_cgroup(rid).exists()
    # Killed while frozen: the agent never ran again.
    assert _beat(run_dir) == beat
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "stopped" and not s.paused()


def test_the_watchdog_pauses_a_run_when_host_memory_is_low(tmp_path: Path) -> None:
    # A floor above what any host has: MemAvailable is below it from the first sample.
    mission = _mission(tmp_path, beats=20)
    text = mission.read_text().replace(
        "[limits]", '[watch]\nhost_memory_min_free = "1048576G"\non_breach = "pause"\n\n[limits]'
    )
    mission.write_text(text)
    rid = new_id()
    run_dir = tmp_path / "runs" / rid
    proc = start_corral(
        "run", str(mission), "--plain", "--id", rid, "--runs-dir", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_for(lambda: bool(_watch_rows(run_dir)), 40, "the watchdog's journal row")
        ((target, detail),) = _watch_rows(run_dir)
        assert target == "host_memory_min_free"
        assert detail["action"] == "pause" and detail["threshold"] == 1 << 50
        assert 0 < detail["value"] < detail["threshold"]
        assert "error" not in detail
        with Store(run_dir / "state.sqlite", readonly=True) as s:
            assert s.run().state == "paused"
        st = json.loads(_cli(tmp_path, "status", rid, "--json").stdout)
        (row,) = st["footprint"]["watchdog"]
        assert row["action"] == "pause" and row["value"] == detail["value"]
        # Paused: the coordinator starts nothing and the run's counters stay flat.
        _assert_no_progress(rid, run_dir)
        assert not sessions(run_dir)
        # The breach persists; the watchdog acted once and lets the user resume.
        result = _cli(tmp_path, "resume", rid)
        assert result.returncode == 0, result.stdout + result.stderr
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(_watch_rows(run_dir)) == 1
    samples = (run_dir / "footprint.jsonl").read_text().splitlines()
    assert samples and '"run"' in samples[-1]


def _watch_rows(run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    path = run_dir / "journal.sqlite"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT target, detail FROM observations WHERE kind = 'watch'"
        ).fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    return [(str(t), dict(json.loads(d))) for t, d in rows]
