"""Pause bookkeeping: the durable pause record and the wall time it does not count."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from corral.broker.actions import Identity
from corral.run import session as session_mod
from corral.run.session import SessionHooks
from corral.run.store import Store, paused_seconds


def test_paused_seconds_counts_only_the_overlap() -> None:
    spans: list[tuple[float, float | None]] = [(10.0, 12.0), (15.0, 16.5), (20.0, None)]
    assert paused_seconds(spans, 0.0, 9.0) == 0.0
    assert paused_seconds(spans, 11.0, 15.5) == 1.0 + 0.5
    # An open pause runs to now.
    assert paused_seconds(spans, 0.0, 23.0) == 2.0 + 1.5 + 3.0


def _store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "state.sqlite")
    store.create_run(
        "r1", mission="m", agent="script", provider="synthetic", max_sessions=1, memory_cap=1
    )
    store.update_run(state="running")
    return store


def test_a_pause_is_durable_and_survives_a_reopen(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        assert store.begin_pause("by the user")
        assert not store.begin_pause("again"), "a second pause must not open a second record"
    # Another process (a new coordinator, `corral status`) reads it back.
    with Store(tmp_path / "state.sqlite", readonly=True) as ro:
        assert ro.paused() and ro.run().state == "paused"
        ((start, end),) = ro.pause_intervals()
        assert end is None and start <= time.monotonic()
    with Store(tmp_path / "state.sqlite") as store:
        assert store.end_pause()
        assert not store.end_pause()
        assert store.run().state == "running" and not store.paused()
        kinds = [k for _, _, k, _ in store.events()]
        assert kinds[-2:] == ["paused", "resumed"]


class _Sandbox:
    """Exits after `polls` calls of poll()."""

    def __init__(self, polls: int) -> None:
        self.left = polls

    def poll(self) -> int | None:
        self.left -= 1
        return 0 if self.left <= 0 else None


class _Egress:
    def alive(self) -> bool:
        return True


class _Journal:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def append(self, obs: Any) -> None:
        self.rows.append(obs)


def _watch(hooks: SessionHooks, polls: int, wall: float) -> tuple[str | None, _Journal]:
    journal = _Journal()
    reason = session_mod._watch(
        _Sandbox(polls),  # type: ignore[arg-type]
        _Egress(),  # type: ignore[arg-type]
        wall=wall,
        journal=journal,  # type: ignore[arg-type]
        ident=Identity(run="r1", session="1", env="agent"),
        hooks=hooks,
    )
    return reason, journal


def test_paused_time_does_not_count_against_the_wall_time() -> None:
    # Control: the same session, never paused, runs out of its wall time.
    reason, journal = _watch(SessionHooks(), polls=10, wall=0.2)
    assert reason == "wall time 0.2s reached" and journal.rows
    # Paused the whole time (what the durable record says): no timeout, the agent finishes.
    reason, journal = _watch(SessionHooks(paused_s=lambda since, now: now - since), 10, 0.2)
    assert reason is None and not journal.rows


class _Waitable(_Sandbox):
    def __init__(self, polls: int) -> None:
        super().__init__(polls)
        self.waited: list[float | None] = []

    def wait(self, timeout_s: float | None = None) -> str:
        self.waited.append(timeout_s)
        return "timeout" if timeout_s is not None else "exited"


def test_a_check_timeout_does_not_count_paused_time() -> None:
    from corral.run.pause import wait_unpaused

    # Control: never paused, the backend's wait gets the last stretch and times out.
    sb = _Waitable(polls=1000)
    assert wait_unpaused(sb, 0.3, lambda _a, _b: 0.0, poll_s=0.05) == "timeout"  # type: ignore[arg-type, comparison-overlap]
    assert sb.waited and sb.waited[0] is not None and sb.waited[0] <= 0.05
    # Paused throughout: the check runs to its end however long that is.
    sb = _Waitable(polls=12)
    assert wait_unpaused(sb, 0.3, lambda a, b: b - a, poll_s=0.05) == "exited"  # type: ignore[arg-type, comparison-overlap]
    assert sb.waited == [None]
