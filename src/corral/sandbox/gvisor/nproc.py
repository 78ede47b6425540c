"""Forks the sentry refused at the pids limit, counted from the sentry's own log.

Inside gVisor the pids limit is the sentry's RLIMIT_NPROC (bundle.build_config):
the refused fork never reaches the host kernel, so the host cgroup's
`pids.events` does not count it. The sentry can say so itself: started with
`--strace` for the fork family only, it logs each such call's return, and a
refusal is `X clone(...) = 0 (0x0) errno=11 (try again)`. runsc gets the log
as a pipe (`--debug-log-fd`), never a file: a fork loop inside would grow a
file on the host without bound, while the pipe holds nothing once read.

The log is the sentry's, outside the command's reach, but each line carries
the calling task's name, which the command chooses (15 bytes, newlines
included) and which comes before the sentry's text about the call. So a
refusal is matched anywhere in a line, never anchored at its start: a name
that splits the line cannot hide the refusal that follows it, and 15 bytes
cannot spell one the sentry did not write.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading

__all__ = ["STRACE_FLAGS", "SentryRefusals", "count_refusals"]

#: The fork family: every way a task creates a process or a thread.
_CALLS = ("clone", "clone3", "fork", "vfork")
#: runsc flags for the sentry's fork-family log (the fd flag is added per sandbox).
STRACE_FLAGS: tuple[str, ...] = (
    "--strace",
    f"--strace-syscalls={','.join(_CALLS)}",
    "--debug-command=boot",
)
_REFUSED = re.compile(rb" X (?:clone3?|v?fork)\(.*\) = \S+ \(\S+\) errno=11 \(")
#: Longer lines are not the sentry's fork-family lines (kept only to find their end).
_MAX_LINE = 4096
#: Where the write end is moved: above the descriptors the launcher dup2s itself.
_FD_FLOOR = 10


def count_refusals(lines: list[bytes]) -> int:
    """How many of the sentry's log lines report a fork refused with EAGAIN (pure)."""
    return sum(1 for line in lines if _REFUSED.search(line))


class SentryRefusals:
    """A pipe for runsc's log and a thread counting the refusals read from it.

    `argv_flags()` goes on the `runsc run` command line, with `write_fd` in
    its `pass_fds`; `started()` once runsc has it; `count()` after every
    runsc process is dead (the pipe's writers), which only drains what is left.
    """

    def __init__(self) -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            self.write_fd = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, _FD_FLOOR)
        finally:
            os.close(w)
        self._read_fd = r
        self._hits = 0
        self._thread = threading.Thread(target=self._drain, name="gvisor-nproc", daemon=True)

    def argv_flags(self) -> list[str]:
        return [*STRACE_FLAGS, f"--debug-log=/proc/self/fd/{self.write_fd}"]

    def started(self) -> None:
        """runsc holds the write end now: drop ours (EOF comes when runsc's are gone)."""
        self._close_write()
        self._thread.start()

    def _close_write(self) -> None:
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1

    def _drain(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._read_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            self._hits += count_refusals(lines)
            if len(pending) > _MAX_LINE:
                pending = pending[-_MAX_LINE:]

    def count(self, timeout_s: float = 5.0) -> int:
        """The refusals read once the log ended (or `timeout_s` passed: those read so far)."""
        self._close_write()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return self._hits

    def close(self) -> None:
        self._close_write()
        if self._thread.is_alive():
            # A writer outlived the sandbox (it cannot: they are all in its
            # cgroup); the thread stays blocked on its daemon read.
            return
        with contextlib.suppress(OSError):
            os.close(self._read_fd)
        self._read_fd = -1
