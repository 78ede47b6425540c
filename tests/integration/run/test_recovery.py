"""Crashes and stops: SIGKILL of the coordinator or the broker, `corral stop`, then resume.

Each test asserts on the host: which processes are alive, which cgroups
exist, what state.sqlite and the journal say.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from corral.run.store import RunLock, Store
from corral.sandbox.cgroup import Cgroup
from corral.sandbox.spec import Limits
from tests.integration.run.helpers import (
    alive,
    corral,
    in_phase,
    journal_events,
    journal_ok,
    new_id,
    run_cgroup,
    sessions,
    start_corral,
    wait_for,
    write_mission,
)

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.timeout(60)]


def _start(tmp_path: Path, mission: Path) -> tuple[str, Path, subprocess.Popen[bytes]]:
    rid = new_id()
    proc = start_corral(
        "run",
        str(mission),
        "--plain",
        "--id",
        rid,
        "--runs-dir",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    return rid, tmp_path / "runs" / rid, proc


def _resume(tmp_path: Path, rid: str) -> subprocess.CompletedProcess[str]:
    return corral("resume", rid, "--plain", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)


def _assert_finished_clean(rid: str, run_dir: Path, pids: set[int]) -> None:
    assert not any(alive(p) for p in pids), "a process of the crashed run survived"
    assert not run_cgroup(rid).exists(), "the run cgroup survived"
    assert not RunLock.is_held(run_dir)
    assert journal_ok(run_dir / "journal.sqlite")
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.integrity_ok()
        assert s.run().state == "passed"


@pytest.mark.parametrize(
    ("phase", "knobs"),
    [
        ("agent", {"agent_sleep": 30}),
        ("product", {"product_sleep": 30}),
        ("verify", {"check_sleep": 30}),
    ],
)
def test_sigkill_coordinator_then_resume(
    tmp_path: Path, phase: str, knobs: dict[str, float]
) -> None:
    mission = write_mission(tmp_path / "m", **knobs)  # type: ignore[arg-type]
    rid, run_dir, proc = _start(tmp_path, mission)
    try:
        wait_for(lambda: in_phase(run_dir, 1, phase), 30, f"session 1 {phase}")
        cg = run_cgroup(rid)
        wait_for(lambda: len(cg.pids()) >= 2, 10, "sandbox processes in the run cgroup")
        pids = cg.pids()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # A child caught between fork and exec may hold the lock for a moment.
    wait_for(lambda: not RunLock.is_held(run_dir), 3, "the run lock to be free")
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "running"  # as the crash left it
        assert s.sessions()[0].state == "running"
    # A straggler that escaped bwrap's death (planted by hand: the kernel
    # already killed the real ones) must not survive the resume either.
    straggler = subprocess.Popen(["sleep", "600"])
    planted = Cgroup.create(cg.layout, f"{cg.relpath}/agent-1-deadbeef", Limits())
    planted.attach_pid(straggler.pid)
    try:
        result = _resume(tmp_path, rid)
        assert result.returncode == 0, result.stdout + result.stderr
        straggler.wait(10)
    finally:
        if straggler.poll() is None:
            straggler.kill()
            straggler.wait()
    assert straggler.returncode == -signal.SIGKILL
    _assert_finished_clean(rid, run_dir, pids)
    ss = sessions(run_dir)
    assert ss[0].state == "interrupted" and ss[0].end_reason == f"interrupted during {phase}"
    assert ss[-1].state == "done" and ss[-1].checks_passed == ss[-1].checks_total == 2
    # Only one session ran at a time and the interrupted one is journaled.
    assert [s.n for s in ss] == list(range(1, len(ss) + 1))
    assert ("1", "session 1 was interrupted (corral stopped or crashed)") in journal_events(
        run_dir / "journal.sqlite", "session_interrupted"
    )
    assert journal_events(run_dir / "journal.sqlite", "killed_at_recovery")
    # An interrupted agent session's work is discarded; a commit made before
    # the crash (product, verify) is where the run continues from.
    assert (run_dir / "workspace" / "stage1").exists() == (phase != "agent")


def test_resume_refuses_a_run_that_is_being_driven(tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m", agent_sleep=30)
    rid, run_dir, proc = _start(tmp_path, mission)
    try:
        wait_for(lambda: in_phase(run_dir, 1, "agent"), 30, "session 1 agent")
        result = _resume(tmp_path, rid)
        assert result.returncode == 3 and "another corral process" in result.stderr
        assert in_phase(run_dir, 1, "agent")
    finally:
        stop = corral("stop", rid, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
        proc.wait(20)
    assert stop.returncode == 0


def test_sigkill_broker_ends_the_session_and_the_next_gets_a_new_one(tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m", agent_sleep=30)
    rid, run_dir, proc = _start(tmp_path, mission)
    try:
        wait_for(
            lambda: in_phase(run_dir, 1, "agent") and sessions(run_dir)[0].broker_pid is not None,
            30,
            "the session's broker",
        )
        broker = sessions(run_dir)[0].broker_pid
        assert broker is not None and alive(broker)
        os.kill(broker, signal.SIGKILL)
        assert proc.wait(50) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ss = sessions(run_dir)
    assert ss[0].state == "done" and ss[0].end_reason == "broker died"
    assert ss[1].broker_pid is not None and ss[1].broker_pid != broker
    assert ss[-1].checks_passed == 2
    assert journal_events(run_dir / "journal.sqlite", "broker_died")
    _assert_finished_clean(rid, run_dir, {broker})


def test_stop_kills_everything_and_keeps_state_for_resume(tmp_path: Path) -> None:
    mission = write_mission(tmp_path / "m", agent_sleep=30)
    rid, run_dir, proc = _start(tmp_path, mission)
    try:
        wait_for(lambda: in_phase(run_dir, 1, "agent"), 30, "session 1 agent")
        cg = run_cgroup(rid)
        wait_for(lambda: len(cg.pids()) >= 2, 10, "sandbox processes")
        pids = cg.pids()
        stop = corral("stop", rid, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
        assert stop.returncode == 0, stop.stderr
        assert "stopped" in stop.stdout
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any(alive(p) for p in pids)
    assert not cg.exists()
    with Store(run_dir / "state.sqlite", readonly=True) as s:
        assert s.run().state == "stopped"
        assert s.sessions()[0].state == "interrupted"
    result = _resume(tmp_path, rid)
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_finished_clean(rid, run_dir, pids)
