"""The pause-aware clock and deadlines (pure, on a fake clock)."""

from __future__ import annotations

from corral.pauseclock import Deadline, PausableClock
from corral.run.store import paused_seconds


class _Fake:
    """A fake CLOCK_MONOTONIC and a pause record over it."""

    def __init__(self) -> None:
        self.t = 100.0
        self.pauses: list[tuple[float, float | None]] = []
        self.reads = 0

    def now(self) -> float:
        return self.t

    def paused_s(self, since: float, now: float) -> float:
        self.reads += 1
        return paused_seconds(self.pauses, since, now)

    def pause(self) -> None:
        self.pauses.append((self.t, None))

    def resume(self) -> None:
        start, _ = self.pauses.pop()
        self.pauses.append((start, self.t))


def test_the_clock_stands_still_while_paused_and_runs_otherwise() -> None:
    f = _Fake()
    clock = PausableClock(f.paused_s, f.now)
    t0 = clock()
    f.t += 2
    assert clock() - t0 == 2
    f.pause()
    f.t += 600
    assert clock() - t0 == 2
    f.resume()
    f.t += 1
    assert clock() - t0 == 3
    # A pause before a clock was made is not taken off it.
    late = PausableClock(f.paused_s, f.now)
    l0 = late()
    f.t += 1
    assert late() - l0 == 1
    assert clock() - t0 == 4


def test_the_clock_never_goes_back_when_the_record_is_late() -> None:
    f = _Fake()
    clock = PausableClock(f.paused_s, f.now)
    f.t += 5
    seen = clock()
    # The pause is recorded after the fact, reaching back before `seen`.
    f.pauses.append((f.t - 3, f.t))
    assert clock() >= seen


def test_a_deadline_on_a_paused_clock_survives_a_pause_longer_than_it() -> None:
    f = _Fake()
    clock = PausableClock(f.paused_s, f.now)
    d = Deadline(10.0, clock, f.now)
    f.t += 4
    assert not d.expired() and d.left() == 6
    f.pause()
    f.t += 1000
    assert not d.expired() and d.left() == 6
    f.resume()
    f.t += 5.9
    assert not d.expired()
    f.t += 0.2
    assert d.expired()


def test_the_control_a_deadline_on_the_real_clock_fires_across_the_pause() -> None:
    f = _Fake()
    d = Deadline(10.0, f.now, f.now)
    f.t += 4
    f.pause()
    f.t += 1000
    f.resume()
    assert d.expired()


def test_waiting_what_is_left_never_overshoots_and_reads_the_record_rarely() -> None:
    f = _Fake()
    clock = PausableClock(f.paused_s, f.now)
    d = Deadline(10.0, clock, f.now)
    reads = f.reads
    # Before the earliest end nothing asks the pause record.
    for _ in range(1000):
        assert not d.expired()
        f.t += 0.001
    assert f.reads == reads
    # A waiter blocks for wait_s() at a time: with a pause in the middle it
    # wakes, finds budget left, and waits again; it ends within the budget.
    start_active, start_real = clock(), f.t
    f.pause()
    waits = 0
    while not d.expired():
        w = d.wait_s()
        assert w > 0
        f.t += w
        waits += 1
        if waits == 3:
            f.resume()  # paused across three whole waits
    # It ended exactly when the active budget did, never before, never after.
    assert abs(clock() - start_active - (10.0 - 1.0)) < 1e-9
    assert f.t - start_real > 10.0


def test_wait_s_is_zero_once_the_budget_is_spent() -> None:
    f = _Fake()
    d = Deadline(1.0, f.now, f.now)
    f.t += 2
    assert d.wait_s() == 0 and d.expired()
