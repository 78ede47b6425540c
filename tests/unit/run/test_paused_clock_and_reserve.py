"""The run's paused-aware clock and the size of the state reserve (pure)."""

from __future__ import annotations

import time

from corral.run.pause import active_clock
from corral.run.rundisk import reserve_bytes

MIB = 1 << 20


def test_the_reserve_is_an_eighth_within_4_and_64_mib() -> None:
    assert reserve_bytes(16 * MIB) == 4 * MIB
    assert reserve_bytes(64 * MIB) == 8 * MIB
    assert reserve_bytes(4 << 30) == 64 * MIB


def test_the_active_clock_stands_still_while_paused_and_runs_otherwise() -> None:
    paused = {"on": True}

    def paused_s(since: float, now: float) -> float:
        # Paused the whole time since the clock was made, or never.
        return now - since if paused["on"] else 0.0

    clock = active_clock(paused_s)
    t0 = clock()
    time.sleep(0.02)
    assert abs(clock() - t0) < 1e-3
    paused["on"] = False
    time.sleep(0.02)
    assert clock() - t0 >= 0.02
