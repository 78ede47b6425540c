"""Runs seen from outside their coordinator: find, list, stop (the shell behind the CLI).

`stop_run` asks the coordinator to stop (flag in state.sqlite, then SIGTERM);
if it does not let go of the run lock in time it is SIGKILLed. Whatever state
the run was left in, the run's cgroup subtree is then swept (every process
killed) and the run is recorded as `stopped`, with its state kept for
`corral resume`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.errors import UsageError
from corral.run.environments import RunLayout
from corral.run.runcg import RunCgroup
from corral.run.rundetail import RunDetail, run_detail
from corral.run.rundisk import ensure_mounted
from corral.run.store import TERMINAL_RUN_STATES, RunLock, RunRecord, SessionRecord, Store

__all__ = ["RunStatus", "find_run", "list_runs", "run_status", "stop_run"]

DEFAULT_RUNS_DIR = Path(".corral/runs")


def find_run(ref: str, runs_dir: Path = DEFAULT_RUNS_DIR) -> RunLayout:
    """A run by id (under `runs_dir`), unique id prefix, or path to its directory."""
    p = Path(ref)
    if p.is_dir():
        ensure_mounted(p)
    if (p / "state.sqlite").is_file():
        return RunLayout(p.absolute())
    direct = runs_dir / ref
    if direct.is_dir():
        ensure_mounted(direct)
    if (direct / "state.sqlite").is_file():
        return RunLayout(direct.absolute())
    if runs_dir.is_dir() and "/" not in ref:
        matches = [d for d in runs_dir.iterdir() if d.name.startswith(ref)]
        for d in matches:
            if d.is_dir():
                ensure_mounted(d)
        matches = [d for d in matches if (d / "state.sqlite").is_file()]
        if len(matches) == 1:
            return RunLayout(matches[0].absolute())
        if len(matches) > 1:
            raise UsageError(f"run {ref!r} is ambiguous: {', '.join(d.name for d in matches)}")
    raise UsageError(f"no run {ref!r} in {runs_dir}")


def list_runs(runs_dir: Path = DEFAULT_RUNS_DIR) -> list[RunLayout]:
    if not runs_dir.is_dir():
        return []
    for d in runs_dir.iterdir():
        if d.is_dir():
            ensure_mounted(d)
    dirs = [d for d in runs_dir.iterdir() if (d / "state.sqlite").is_file()]
    return [RunLayout(d.absolute()) for d in sorted(dirs, key=lambda d: d.stat().st_mtime)]


@dataclass(frozen=True, slots=True)
class RunStatus:
    run: RunRecord
    sessions: tuple[SessionRecord, ...]
    active: bool
    allowed: int
    denied: int
    footprint: dict[str, Any] | None = None
    detail: RunDetail | None = None

    @property
    def display_state(self) -> str:
        if self.run.state == "running" and not self.active:
            return "interrupted (resume it)"
        if self.run.state == "paused" and not self.active:
            return "paused, coordinator gone (resume it)"
        return self.run.state

    def to_json_dict(self) -> dict[str, Any]:
        last = next((s for s in reversed(self.sessions) if s.checks_total), None)
        return {
            "id": self.run.id,
            "state": self.display_state,
            "active": self.active,
            "session": self.sessions[-1].n if self.sessions else 0,
            "max_sessions": self.run.max_sessions,
            "checks_passed": last.checks_passed if last else 0,
            "checks_total": last.checks_total if last else 0,
            "observations": {"allowed": self.allowed, "denied": self.denied},
            "peak_memory_bytes": self.run.peak_memory,
            "memory_cap_bytes": self.run.memory_cap,
            "end_reason": self.run.end_reason,
            "footprint": self.footprint,
            **(self.detail.to_json_dict() if self.detail is not None else {}),
        }


def run_status(layout: RunLayout) -> RunStatus:
    from corral.run.coordinator import journal_counts

    with Store(layout.state, readonly=True) as store:
        run = store.run()
        sessions = tuple(store.sessions())
        last = next((store.checks(s.n) for s in reversed(sessions) if s.checks_total), [])
    from corral.run.footprint import footprint

    allowed, denied = journal_counts(layout.journal, run.id)
    active = RunLock.is_held(layout.root)
    detail = run_detail(layout.journal, run.id, last)
    return RunStatus(run, sessions, active, allowed, denied, footprint(layout, run), detail)


def _wait_unlocked(layout: RunLayout, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not RunLock.is_held(layout.root):
            return True
        time.sleep(0.05)
    return not RunLock.is_held(layout.root)


def _unpause_killed(layout: RunLayout) -> None:
    # A frozen process acts on SIGKILL only once thawed, so the coordinator,
    # told to stop, would wait on its paused sandboxes: they are killed
    # while frozen (nothing of them runs again) and then thawed.
    with Store(layout.state) as store:
        if not store.paused():
            return
        cg = RunCgroup.detect(layout.run_id)
        if cg is not None and cg.exists():
            cg.kill_and_thaw()
        store.end_pause()


def stop_run(layout: RunLayout, timeout_s: float = 20.0) -> str:
    """Stop a run; returns its state afterwards. Everything of the run is killed."""
    with Store(layout.state) as store:
        run = store.run()
        if run.state in TERMINAL_RUN_STATES and not RunLock.is_held(layout.root):
            return run.state
        store.update_run(stop_requested=1)
        pid = run.coordinator_pid
    if RunLock.is_held(layout.root) and pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        _unpause_killed(layout)
        if not _wait_unlocked(layout, timeout_s):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_unlocked(layout, 5.0)
    lock = RunLock(layout.root)
    lock.acquire(wait_s=3.0)
    try:
        _unpause_killed(layout)
        cg = RunCgroup.detect(layout.run_id)
        killed = cg.sweep() if cg is not None else 0
        with Store(layout.state) as store:
            interrupted = store.mark_interrupted()
            if store.run().state not in TERMINAL_RUN_STATES:
                store.update_run(
                    state="stopped", end_reason="stopped by the user", coordinator_pid=None
                )
            if killed or interrupted:
                store.event("stop_cleanup", killed=killed, interrupted=interrupted)
            return store.run().state
    finally:
        lock.release()
