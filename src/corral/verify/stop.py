"""SIGINT and SIGTERM to `corral verify` (host code).

Python's default turns SIGINT into KeyboardInterrupt wherever the main thread
is, and SIGTERM ends the process outright; either way the probe being run
lives on, since its processes have a session of their own (no terminal's
signal reaches them) and nobody is left to kill them. Here both become a
KeyboardInterrupt, which the runner's cleanup turns into the probe's end;
while a probe's process is being created it waits (`sandbox.interrupts`): an
exception raised inside `subprocess.Popen` between its fork and exec would
leave a child that does not carry the probe's marker yet.
"""

from __future__ import annotations

import signal

from corral.sandbox import interrupts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["interrupt_on_signals"]


def _raise() -> None:
    raise KeyboardInterrupt


def _on_signal(_signum: int, _frame: FrameType | None) -> None:
    interrupts.deliver(_raise)


def interrupt_on_signals() -> None:
    """Turn SIGINT and SIGTERM into KeyboardInterrupt, deferred while a probe starts."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _on_signal)
