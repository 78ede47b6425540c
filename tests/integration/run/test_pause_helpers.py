"""A helper's start and finish deadlines stop counting while the run is paused (issue 10).

The synthetic provider, the forwarder, the MCP gateway and the report
renderer are processes in the run cgroup: `corral pause` freezes them, and
the coordinator's wait for their answer (`Helper.read_line`: each one's
start, the provider's token count) or their exit (`Helper.wait`: the
report) is timed on the run's clock, which the coordinator hands to each.
The attack: pause the run (durable record, then the kernel freeze) for twice
the deadline while a helper starts; after the thaw it must be heard, not
given up on. Judged from the host: the line on the helper's pipe, its exit
status, the pause record. The control is the same with the pause record
not consulted.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.errors import CorralError, HelperError
from corral.pauseclock import PausableClock
from corral.run.helpers import Helper
from corral.run.runcg import RunCgroup
from corral.run.store import Store

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup, pytest.mark.timeout(60)]

_DEADLINE_S = 1.5
_PAUSE_S = 3.0


@pytest.fixture
def run_cg() -> Iterator[RunCgroup]:
    cg = RunCgroup.detect(f"t{secrets.token_hex(4)}")
    assert cg is not None
    cg.create(512 << 20)
    try:
        yield cg
    finally:
        with contextlib.suppress(CorralError, OSError):
            cg.thaw()
        with contextlib.suppress(CorralError, OSError):
            cg.sweep()


@contextlib.contextmanager
def _paused(state: Path, cg: RunCgroup, seconds: float) -> Iterator[list[float]]:
    """`corral pause` now (record, then freeze); `corral resume` `seconds` later."""
    with Store(state) as store:
        store.begin_pause("test")
    cg.freeze()
    thawed: list[float] = []

    def resume() -> None:
        time.sleep(seconds)
        cg.thaw()
        thawed.append(time.monotonic())
        with Store(state) as store:
            store.end_pause()

    t = threading.Thread(target=resume, daemon=True)
    t.start()
    try:
        yield thawed
    finally:
        t.join(30)


def _clock(store: Store, pause_aware: bool) -> Callable[[], float]:
    return PausableClock(store.paused_s) if pause_aware else time.monotonic


def _spawn(cg: RunCgroup, script: str, clock: Callable[[], float], log: Path) -> Helper:
    """A helper process whose work is `script`, joined to `helpers-provider` first.

    The helpers corral ships are Python (seconds to start on a loaded host);
    a shell answers at once, so what is timed is only the pause.
    """
    join = " ".join(f'echo 0 > "{p}" &&' for p in cg.helper_procs("provider"))
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f"{join} exec /bin/sh -c '{script}'"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    return Helper("provider", proc, log, clock)


def _answer(tmp_path: Path, cg: RunCgroup, pause_aware: bool) -> str | HelperError:
    state = tmp_path / "state.sqlite"
    with Store(state) as store, _paused(state, cg, _PAUSE_S) as thawed:
        helper = _spawn(cg, "echo ready; read x", _clock(store, pause_aware), tmp_path / "l")
        try:
            line = helper.read_line(_DEADLINE_S)
            assert thawed, "the helper answered while frozen"
            return line
        except HelperError as exc:
            return exc
        finally:
            helper.close(1.0)


def test_a_helper_paused_while_it_starts_is_heard_after_resume(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    outcome = _answer(tmp_path, run_cg, pause_aware=True)
    assert outcome == "ready", outcome
    with Store(tmp_path / "state.sqlite", readonly=True) as s:
        ((start, end),) = s.pause_intervals()
        assert end is not None and end - start >= _PAUSE_S > _DEADLINE_S


def test_control_on_the_real_clock_the_paused_helper_is_given_up(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    outcome = _answer(tmp_path, run_cg, pause_aware=False)
    assert isinstance(outcome, HelperError), outcome
    assert f"did not answer within {_DEADLINE_S:g} s" in str(outcome)


def _wait(tmp_path: Path, cg: RunCgroup, pause_aware: bool) -> int | HelperError:
    state = tmp_path / "state.sqlite"
    with Store(state) as store, _paused(state, cg, _PAUSE_S):
        helper = _spawn(cg, "exit 3", _clock(store, pause_aware), tmp_path / "l")
        try:
            return helper.wait(_DEADLINE_S)
        except HelperError as exc:
            return exc
        finally:
            helper.close(1.0)


def test_a_helper_paused_while_it_works_is_waited_for(tmp_path: Path, run_cg: RunCgroup) -> None:
    assert _wait(tmp_path, run_cg, pause_aware=True) == 3


def test_control_on_the_real_clock_the_paused_helper_is_killed(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    outcome = _wait(tmp_path, run_cg, pause_aware=False)
    assert isinstance(outcome, HelperError), outcome
    assert f"did not finish within {_DEADLINE_S:g} s" in str(outcome)


def test_a_helper_that_never_answers_is_still_given_up_when_not_paused(
    tmp_path: Path, run_cg: RunCgroup
) -> None:
    # It never says a line: the run's clock, with no pause, runs out.
    with Store(tmp_path / "state.sqlite") as store:
        helper = _spawn(run_cg, "read x", PausableClock(store.paused_s), tmp_path / "l")
        try:
            with pytest.raises(HelperError, match="did not answer within 1 s"):
                helper.read_line(1.0)
        finally:
            helper.close(1.0)
