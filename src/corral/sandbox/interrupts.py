"""Interrupts that wait while a sandbox's first process is being created (host code).

`corral exec` turns SIGINT/SIGTERM/SIGHUP (and, in a launcher worker, the
client's EOF) into an exception raised from a signal handler, so it lands
wherever the main thread is. Raised inside `subprocess.Popen` after the fork
(it waits on its error pipe for the exec), it unwinds without a Popen object:
the child goes on to exec bwrap, runsc or QEMU, and nothing holds its handle
to kill it. Blocking the signals cannot prevent that: the process has other
threads (the broker link, the unix supervisor), and the kernel hands a
process-directed signal to any thread that has it unblocked, whose C handler
then wakes the main thread's Python handler all the same. So the handler
asks `deliver`, which holds the interrupt while a backend is inside
`deferred()` and raises it when that block ends, when the backend holds a
handle that tears the sandbox down.
"""

from __future__ import annotations

import contextlib
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["deferred", "deliver"]

_depth = [0]
_held: list[Callable[[], None]] = []


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold interrupts for the block; the first one held is raised when it ends.

    Only in the main thread, where Python runs signal handlers: another
    thread's Popen cannot be hit by them.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if not _depth[0] and _held:
            fire = _held[0]
            _held.clear()
            fire()


def deliver(fire: Callable[[], None]) -> None:
    """Run `fire` (which raises the interrupt) now, or when the `deferred()` block ends."""
    if _depth[0]:
        _held.append(fire)
        return
    fire()
