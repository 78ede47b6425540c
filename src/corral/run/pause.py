"""`corral pause` and the thaw half of `corral resume` (the shell behind the CLI).

A pause freezes the run cgroup, so every process of the run stops where it
is (sandboxes, brokers, MCP servers, helpers) with its memory kept. The
coordinator is not in the run cgroup and keeps running: it sees the open
pause in state.sqlite and does not count it against the session's wall time.

Order, so that a crash at any point leaves a recoverable run: the pause is
committed before the cgroup is frozen (a crash in between leaves a paused
record over running processes, which `resume` thaws, a no-op), and it is
closed only after the thaw.

Code frozen with the run cannot keep its own time: a frozen process's
timers run on, and fire at once on the thaw. The verifier's check runner
times each part of a check itself, so the pauses are also published, as
CLOCK_MONOTONIC intervals, in `tools/pauses.json` (bound read-only into
every verifier): written with the open pause before the freeze, rewritten
closed after the thaw. If the first write fails, a check frozen mid-part
may time out on the thaw; if the rewrite fails, the open pause in the file
only lengthens the runner's own budget: the coordinator's bound on the
whole verifier (from the durable record) still holds.

What a client of a frozen broker sees: the only clients of a session's
broker are the agent sandbox's processes, frozen with it. The verifier's
port forwarder (in the coordinator) never runs while the run is paused,
because the coordinator starts no new work then. A connection made to a
frozen listener anyway completes the TCP handshake in the kernel and waits
in the listen backlog until the thaw: it is not refused, it stalls.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import CorralError, UsageError
from corral.pauseclock import Deadline, PausableClock
from corral.run.environments import RunLayout
from corral.run.runcg import RunCgroup
from corral.run.store import TERMINAL_RUN_STATES, RunLock, Store, paused_seconds

if TYPE_CHECKING:
    from corral.sandbox.backend import Sandbox
    from corral.sandbox.spec import ExecResult

__all__ = [
    "active_clock",
    "file_paused_s",
    "pause_run",
    "pauses_json",
    "publish_pauses",
    "thaw_run",
    "wait_unpaused",
]


def _cgroup(layout: RunLayout) -> RunCgroup:
    cg = RunCgroup.detect(layout.run_id)
    if cg is None or not cg.exists():
        raise UsageError(f"run {layout.run_id} has no run cgroup (is it running?)")
    return cg


def pause_run(layout: RunLayout, reason: str = "paused by the user") -> bool:
    """Freeze the run; False if it was already paused. UsageError if it is not running."""
    with Store(layout.state) as store:
        run = store.run()
        if run.state in TERMINAL_RUN_STATES:
            raise UsageError(f"run {run.id} is {run.state}; only a running run can be paused")
        if not RunLock.is_held(layout.root):
            raise UsageError(f"run {run.id} is not being driven (corral resume it)")
        cg = _cgroup(layout)
        if not store.begin_pause(reason):
            return False
        # Not fatal: without the file a check frozen mid-part may time out on
        # the thaw (its own timer ran on); the run's protection is unchanged.
        with contextlib.suppress(OSError):
            publish_pauses(layout, store.pause_intervals)
        try:
            cg.freeze()
        except CorralError:
            # Not frozen, so not paused: undo the record before reporting.
            cg.thaw()
            store.end_pause()
            with contextlib.suppress(OSError):
                publish_pauses(layout, store.pause_intervals)
            raise
    return True


def thaw_run(layout: RunLayout) -> bool:
    """Thaw a paused run and close its pause; False if it was not paused.

    With its coordinator gone (killed while paused) the cgroup stays frozen
    and only the pause is closed: the orphaned sessions are not continued;
    the recovery that `corral resume` then runs kills them while they are
    still frozen and restarts from the last commit.
    """
    with Store(layout.state) as store:
        if not store.paused():
            return False
        if RunLock.is_held(layout.root):
            cg = RunCgroup.detect(layout.run_id)
            if cg is not None and cg.exists():
                cg.thaw()
        store.end_pause()
        with contextlib.suppress(OSError):
            publish_pauses(layout, store.pause_intervals)
    return True


def file_paused_s(path: Path) -> Callable[[float, float], float]:
    """`paused_s` from the published pauses at `path`, for a process of the run.

    A helper frozen with the run cannot consult state.sqlite's writer, but
    can read what `publish_pauses` wrote (bounded; unreadable counts 0).
    """

    def paused_s(since: float, now: float) -> float:
        try:
            with path.open(encoding="utf-8") as fh:
                doc = json.loads(fh.read(1 << 16))
            intervals = [(float(a), None if b is None else float(b)) for a, b in doc]
        except (OSError, ValueError, TypeError):
            return 0.0
        return paused_seconds(intervals, since, now)

    return paused_s


def pauses_json(intervals: list[tuple[float, float | None]]) -> str:
    """The pauses as the check runner reads them: `[[start, end|null], ...]` (pure)."""
    return json.dumps([[start, end] for start, end in intervals[-1000:]])


def publish_pauses(
    layout: RunLayout, intervals: Callable[[], list[tuple[float, float | None]]]
) -> None:
    """Write the run's pauses (`intervals()`, read from the durable record) to
    `layout.pauses` whole (rename), for code frozen with the run.

    Under a lock, read and write are one step: `corral pause`, `resume` and
    the coordinator may publish at once, and whichever renames last must
    have read the record last, or a pause committed in between is lost.
    """
    if not layout.tools.is_dir():
        return
    fd = os.open(layout.tools / ".pauses.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        tmp = layout.pauses.with_name(f".pauses.{os.getpid()}.tmp")
        tmp.write_text(pauses_json(intervals()), encoding="utf-8")
        tmp.chmod(0o644)
        os.replace(tmp, layout.pauses)
    finally:
        os.close(fd)


def wait_unpaused(
    running: Sandbox,
    timeout_s: float,
    paused_s: Callable[[float, float], float],
    poll_s: float = 0.1,
) -> ExecResult:
    """`running.wait(timeout_s)`, where the time the run spent paused does not count.

    The sandbox is watched here on the run's clock; the backend's own wait
    is called only once it has exited or the budget is spent (with 0 left:
    it times out at once), so its timer never runs across a pause.
    """
    deadline = Deadline(timeout_s, PausableClock(paused_s))
    while running.poll() is None:
        if deadline.expired():
            return running.wait(0.0)
        time.sleep(min(poll_s, deadline.wait_s()))
    return running.wait()


def active_clock(paused_s: Callable[[float, float], float]) -> Callable[[], float]:
    """A clock that stands still while the run is paused (seconds, from now).

    For deadlines of work that freezes with the run (the product's
    `ready_timeout`, host git's budget, a helper's answer):
    `time.monotonic()` minus the paused time since the clock was made, so a
    pause never uses up the budget (`corral.pauseclock`).
    """
    return PausableClock(paused_s)
