"""Clocks that stop while a run is paused, and deadlines on them (pure).

A run's budgets are budgets of *active* time: while `corral pause` holds the
run cgroup frozen, nothing of the run can make progress, so nothing of the
run may be charged for it. The pause record (`corral.run.store`) says which
stretches of CLOCK_MONOTONIC the run spent paused; a `PausableClock` is
CLOCK_MONOTONIC minus those stretches.

    clock = PausableClock(store.paused_s)          # time.monotonic() by default
    deadline = Deadline(300.0, clock)
    while not deadline.expired():                  # cheap between re-checks
        work(timeout=deadline.wait_s())            # never overshoots the budget

Why waiting `left()` real seconds is always safe: the active clock advances
no faster than the real one, so a budget with `left` active seconds cannot
run out in less than `left` real seconds. A waiter that re-checks after
that long (and again, for what is left, if a pause made the budget last
longer) never kills work early and never lets it overrun.

The processes of a frozen run are frozen too, and a frozen process's own
timers keep counting: on the thaw its poll/select returns "timed out" at
once. A budget of work that runs in the run cgroup must therefore be
enforced by a waiter outside the run (the coordinator), on this clock.

Nothing here does I/O: `paused_s` and `now` are the caller's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "Deadline", "PausableClock", "PausedSeconds", "never_paused"]

#: Seconds of [since, now] (both CLOCK_MONOTONIC) the run spent paused.
PausedSeconds = Callable[[float, float], float]
#: A clock of seconds (only differences between its readings mean anything).
Clock = Callable[[], float]


def never_paused(_since: float, _now: float) -> float:
    """The pause source of work that is not part of a run: never paused."""
    return 0.0


class PausableClock:
    """`now()` minus the time the run was paused since the clock was made.

    Reading it asks `paused_s` (the durable pause record) once; monotonic
    even if `paused_s` is not exact, since a reading never goes below the
    last one.
    """

    __slots__ = ("_last", "_now", "_origin", "_paused_s")

    def __init__(self, paused_s: PausedSeconds = never_paused, now: Clock = time.monotonic) -> None:
        self._paused_s = paused_s
        self._now = now
        self._origin = now()
        self._last = self._origin

    def __call__(self) -> float:
        now = self._now()
        value = max(now - self._paused_s(self._origin, now), self._last)
        self._last = value
        return value


class Deadline:
    """`budget_s` seconds of `clock` from now.

    `clock` is the run's `PausableClock` (active time) or a plain monotonic
    clock; `now` is the real clock the caller waits on. `expired()` reads
    `clock` only once the real clock has gone past the earliest moment the
    budget could have run out, so it is cheap to call in a loop.
    """

    __slots__ = ("_clock", "_end", "_now", "_recheck", "budget_s")

    def __init__(self, budget_s: float, clock: Clock = time.monotonic, now: Clock = time.monotonic):
        self.budget_s = budget_s
        self._clock = clock
        self._now = now
        self._end = clock() + budget_s
        self._recheck = now() + budget_s

    def left(self) -> float:
        """Seconds of budget left on `clock` (≤ 0 once it is spent)."""
        left = self._end - self._clock()
        self._recheck = self._now() + max(left, 0.0)
        return left

    def expired(self) -> bool:
        if self._now() < self._recheck:
            return False
        return self.left() <= 0

    def wait_s(self) -> float:
        """Real seconds a waiter may block before it must look again (≥ 0).

        That is at most what is left of the budget (see the module
        docstring); reads `clock` only when the last look is used up.
        """
        wait = self._recheck - self._now()
        if wait > 0:
            return wait
        return max(self.left(), 0.0)
