"""A test-only pause point for the fleet simulation (host side, never reachable from a sandbox).

With `CORRAL_TEST_PAUSE_AT=<point>` and `CORRAL_TEST_PAUSE_FIFO=<path>` in a
worker's environment, `pause_at(point)` opens the FIFO for reading, which
blocks until the test opens it for writing: the test then knows the worker
stands exactly there and SIGKILLs it (no timing). Both variables are read
from the worker's own environment; a sandbox's environment is built from its
spec and cannot set them, and nothing a sandbox writes names the FIFO.
Unset (production), the check is one dictionary lookup.
"""

from __future__ import annotations

import os
from typing import Final, Literal

__all__ = ["ENV_FIFO", "ENV_POINT", "pause_at"]

ENV_POINT: Final = "CORRAL_TEST_PAUSE_AT"
ENV_FIFO: Final = "CORRAL_TEST_PAUSE_FIFO"


def pause_at(point: Literal["commit"]) -> None:
    """Block on the test's FIFO if the environment asks to pause at `point`."""
    if os.environ.get(ENV_POINT) != point:
        return
    fifo = os.environ.get(ENV_FIFO)
    if not fifo:
        return
    with open(fifo, "rb") as fh:
        fh.read()  # until the test closes its end (it kills us first)
