"""Host git's wall-clock budget stops counting while the run is paused (issue 10).

Host git runs in the run's `helpers` cgroup, so `corral pause` freezes it
mid-work. Its budget is measured on the run's clock (the durable pause
record subtracted), so a pause longer than the budget does not kill it on
the thaw. Judged from the host: the commit in the trusted repository, the
snapshot on disk, the pause record, the run cgroup's processes.

The control is the same pause with the pause record not consulted (the
clock `time.monotonic`): the budget fires across the pause. And without a
pause the budget still fires (git blocked on a FIFO nobody writes).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.errors import CorralError
from corral.hostgit import GitBudget, GitBudgetError, TrustedRepo, safe_git
from corral.pauseclock import Deadline, PausableClock
from corral.run.runcg import RunCgroup
from corral.run.store import Store

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup, pytest.mark.timeout(60)]

# The commit's own work is ~10 git processes (~0.5 s here): well inside
# the budget, which only a pause longer than it can use up.
_BUDGET_S = 3.0
_PAUSE_S = 4.5
_LINKS = 10


@pytest.fixture
def run_cg() -> Iterator[RunCgroup]:
    cg = RunCgroup.detect(f"t{secrets.token_hex(4)}")
    assert cg is not None
    cg.create(256 << 20)
    try:
        yield cg
    finally:
        with contextlib.suppress(CorralError, OSError):
            cg.thaw()
        with contextlib.suppress(CorralError, OSError):
            cg.sweep()


class _Pauser:
    """`corral pause`'s two steps (record, then freeze) from another thread, later undone."""

    def __init__(self, state: Path, cg: RunCgroup) -> None:
        self.state = state
        self.cg = cg
        self.thawed_at = 0.0
        self.error: BaseException | None = None

    def pause_for(
        self, seconds: float, when: Callable[[], bool] = lambda: True
    ) -> threading.Thread:
        def run() -> None:
            try:
                deadline = time.monotonic() + 20
                while not when():
                    if time.monotonic() > deadline:
                        raise AssertionError("git never appeared in the run cgroup")
                    time.sleep(0.002)
                with Store(self.state) as store:
                    store.begin_pause("test")
                    self.cg.freeze()
                    time.sleep(seconds)
                    self.cg.thaw()
                    self.thawed_at = time.monotonic()
                    store.end_pause()
            except BaseException as exc:
                self.error = exc

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def _workspace(root: Path, links: int) -> Path:
    ws = root / "ws"
    ws.mkdir()
    (ws / "file").write_text("data")
    # Each symlink is one `git hash-object`: the commit is a long run of git
    # processes, so the pause lands in the middle of it.
    for i in range(links):
        os.symlink(f"target-{i}", ws / f"link-{i}")
    return ws


def _repo(tmp_path: Path, cg: RunCgroup, ws: Path, clock: Callable[[], float]) -> TrustedRepo:
    repo = TrustedRepo(
        tmp_path / "git",
        ws,
        budget=GitBudget(timeout_s=_BUDGET_S),
        cgroup_procs=cg.helper_procs(),
        clock=clock,
    )
    repo.init()
    return repo


def _commit_paused_midway(
    tmp_path: Path, cg: RunCgroup, pause_aware: bool
) -> tuple[str | GitBudgetError, _Pauser, float]:
    ws = _workspace(tmp_path, _LINKS)
    state = tmp_path / "state.sqlite"
    with Store(state) as store:
        clock = PausableClock(store.paused_s) if pause_aware else time.monotonic
        repo = _repo(tmp_path, cg, ws, clock)
        pauser = _Pauser(state, cg)
        thread = pauser.pause_for(_PAUSE_S, when=lambda: bool(cg.pids()))
        outcome: str | GitBudgetError
        try:
            outcome = repo.commit_all("paused midway")
        except GitBudgetError as exc:
            outcome = exc
        done_at = time.monotonic()
        thread.join(30)
    assert pauser.error is None, pauser.error
    return outcome, pauser, done_at


def test_a_commit_paused_for_longer_than_its_budget_completes_after_resume(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    outcome, pauser, done_at = _commit_paused_midway(tmp_path, run_cg, pause_aware=True)
    assert isinstance(outcome, str), outcome
    # In progress when paused: it finished only after the thaw.
    assert done_at >= pauser.thawed_at > 0
    with Store(tmp_path / "state.sqlite", readonly=True) as s:
        ((start, end),) = s.pause_intervals()
        assert end is not None and end - start >= _PAUSE_S > _BUDGET_S
    # The commit is in the trusted repository, every file of the workspace in it.
    repo = TrustedRepo(tmp_path / "git", tmp_path / "ws")
    assert repo.head() == outcome
    names = repo.git("ls-tree", "--name-only", outcome).decode().split()
    assert "file" in names and len(names) == _LINKS + 1
    assert not run_cg.pids()


def test_control_a_budget_on_the_real_clock_fails_the_paused_commit(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    outcome, pauser, _ = _commit_paused_midway(tmp_path, run_cg, pause_aware=False)
    assert pauser.thawed_at > 0
    assert isinstance(outcome, GitBudgetError), outcome
    assert "wall-clock budget" in str(outcome)
    repo = TrustedRepo(tmp_path / "git", tmp_path / "ws")
    with pytest.raises(CorralError):
        repo.head()  # nothing was recorded


def _snapshot_paused(tmp_path: Path, cg: RunCgroup, pause_aware: bool) -> list[str] | Exception:
    ws = _workspace(tmp_path, 0)
    (ws / "big").write_bytes(os.urandom(4 << 20))
    state = tmp_path / "state.sqlite"
    with Store(state) as store:
        clock = PausableClock(store.paused_s) if pause_aware else time.monotonic
        repo = _repo(tmp_path, cg, ws, clock)
        sha = repo.commit_all("to snapshot")
        # `git archive` is frozen from its first instruction (it joins a frozen
        # cgroup); the tar stream stays silent for twice the budget.
        pauser = _Pauser(state, cg)
        with Store(state) as other:
            other.begin_pause("test")
        cg.freeze()

        def resume() -> None:
            time.sleep(_PAUSE_S)
            cg.thaw()
            pauser.thawed_at = time.monotonic()
            with Store(state) as other:
                other.end_pause()

        thread = threading.Thread(target=resume, daemon=True)
        thread.start()
        try:
            return repo.snapshot(sha, tmp_path / "snap")
        except CorralError as exc:
            return exc
        finally:
            thread.join(30)


def test_a_snapshot_paused_for_longer_than_its_budget_completes_after_resume(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    outcome = _snapshot_paused(tmp_path, run_cg, pause_aware=True)
    assert outcome == [], outcome
    snap = tmp_path / "snap"
    assert (snap / "big").read_bytes() == (tmp_path / "ws" / "big").read_bytes()


def test_control_a_snapshot_on_the_real_clock_fails_across_the_pause(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    outcome = _snapshot_paused(tmp_path, run_cg, pause_aware=False)
    assert isinstance(outcome, GitBudgetError), outcome
    assert not (tmp_path / "snap" / "big").exists()


def test_the_budget_still_fires_when_the_run_is_not_paused(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    ws = _workspace(tmp_path, 0)
    fifo = ws / "never-written"
    os.mkfifo(fifo)
    with Store(tmp_path / "state.sqlite") as store:
        repo = _repo(tmp_path, run_cg, ws, PausableClock(store.paused_s))
        # git opens the FIFO and blocks for good: only the budget ends it.
        started = time.monotonic()
        with pytest.raises(GitBudgetError, match="wall-clock budget of 1s"):
            safe_git(
                repo.git_dir,
                ws,
                ["hash-object", str(fifo)],
                cgroup_procs=repo.cgroup_procs,
                deadline=Deadline(1.0, repo.clock),
            )
        assert time.monotonic() - started >= 1.0
    assert not run_cg.pids(), "the blocked git was left running"
