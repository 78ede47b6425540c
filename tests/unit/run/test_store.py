"""The run state database and the run lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.run.store import CheckResult, RunLock, RunLockedError, Store


def _store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "state.sqlite")
    s.create_run(
        "r1",
        mission="m",
        agent="script",
        provider="synthetic:x",
        max_sessions=3,
        memory_cap=1 << 30,
    )
    return s


def test_session_lifecycle_and_checks(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        s.begin_session(1)
        s.update_session(1, phase="verify", tokens=12, detail={"a": 1})
        s.record_checks(
            1,
            [
                CheckResult("a", True, "passed", 0, 0.1),
                CheckResult("b", False, "exit 1", 1, 0.2, "boom"),
            ],
        )
        s.end_session(1, state="done", end_reason="agent finished")
        [rec] = s.sessions()
        assert (rec.state, rec.tokens, rec.checks_passed, rec.checks_total) == ("done", 12, 1, 2)
        assert rec.detail == {"a": 1}
        assert [c.name for c in s.checks(1)] == ["a", "b"] and s.checks(1)[1].output == "boom"
        assert s.integrity_ok()


def test_running_sessions_become_interrupted(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        s.begin_session(1)
        s.update_session(1, phase="verify")
        assert s.mark_interrupted() == [1]
        rec = s.session(1)
        assert rec is not None and rec.state == "interrupted"
        assert rec.end_reason == "interrupted during verify"
        assert s.mark_interrupted() == []


def test_state_is_durable_across_a_killed_writer(tmp_path: Path) -> None:
    db = tmp_path / "state.sqlite"
    _store(tmp_path).close()
    code = (
        "import os, sys; from pathlib import Path; from corral.run.store import Store;"
        f"s = Store(Path({str(db)!r})); s.begin_session(1); s.update_run(state='running');"
        "os.kill(os.getpid(), 9)"
    )
    subprocess.run([sys.executable, "-c", code], check=False, timeout=30)
    with Store(db) as s:
        assert s.run().state == "running" and s.sessions()[0].state == "running"
        assert s.integrity_ok()


def test_unknown_fields_are_refused(tmp_path: Path) -> None:
    with _store(tmp_path) as s, pytest.raises(ValueError):
        s.update_run(bogus=1)


def test_lock_is_exclusive_and_dies_with_its_holder(tmp_path: Path) -> None:
    lock = RunLock(tmp_path)
    lock.acquire()
    assert RunLock.is_held(tmp_path)
    with pytest.raises(RunLockedError):
        RunLock(tmp_path).acquire()
    lock.release()
    assert not RunLock.is_held(tmp_path)
    code = (
        "import os, time; from pathlib import Path; from corral.run.store import RunLock;"
        f"RunLock(Path({str(tmp_path)!r})).acquire(); print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert RunLock.is_held(tmp_path)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert not RunLock.is_held(tmp_path)
