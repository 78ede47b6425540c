"""Pipes between corral's stdio and runsc's: runsc never gets a host file.

runsc, started as root, fchowns the descriptors it is given as the
container's stdio to the sandbox's host user, and the command can then
fchmod them through gVisor's host-fd import. Handed corral's own stdio, that
would re-own and re-mode host files: /dev/null, a file the caller
redirected output to, a terminal. So runsc only ever gets the ends of fresh
pipes, and threads here copy bytes between those pipes and the real
descriptors; the worst a re-owned pipe allows is to write to the pipe.

The relay copies to and from its own duplicates of the caller's descriptors:
a caller may close its copy as soon as the sandbox started (as it may under
the namespace backend, whose child holds its own), and a thread still
writing to the closed number would write the command's output into
whatever file next took that number (a journal, a database).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import threading

__all__ = ["StdioRelay"]

_CHUNK = 65536


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _dup(fd: int) -> int:
    """A close-on-exec duplicate of `fd`, or -1 when it is not open."""
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        return -1


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        except OSError:
            return False
        view = view[n:]
    return True


class StdioRelay:
    """Three pipes for runsc's stdio and the threads that feed and drain them.

    `sources` are corral's descriptors for the command's stdin, stdout and
    stderr (None: corral's own fd 0, 1, 2). Call `child_fds()` for Popen,
    `started()` after the spawn, `close()` after the sandbox ended.
    """

    def __init__(self, sources: tuple[int | None, int | None, int | None] | None) -> None:
        """`sources` None: given later with `attach` (a pre-booted sandbox)."""
        self._src: tuple[int, ...] = (-1, -1, -1)
        if sources is not None:
            self.attach(sources)
        self._in_r, self._in_w = os.pipe2(os.O_CLOEXEC)
        self._out_r, self._out_w = os.pipe2(os.O_CLOEXEC)
        self._err_r, self._err_w = os.pipe2(os.O_CLOEXEC)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        #: Thread -> the duplicate it uses, closed once the thread is done.
        self._threads: list[tuple[threading.Thread, int]] = []

    def attach(self, sources: tuple[int | None, int | None, int | None]) -> None:
        """Copy to and from `sources` (before `started`)."""
        # A terminal is never handed over nor read or written behind the
        # caller's back (as with `terminal.stdio_without_tty`): stdin from a
        # terminal is empty, output to one is dropped; `corral exec` passes
        # its pty relay's descriptors instead.
        src = [s if s is not None else i for i, s in enumerate(sources)]
        self._src = tuple(-1 if _isatty(fd) else _dup(fd) for fd in src)

    def write_stdin(self, data: bytes) -> bool:
        """Write `data` first on the command's stdin (before `started`)."""
        return _write_all(self._in_w, data)

    def read_stdout(self, n: int, timeout_s: float) -> bytes:
        """Up to `n` bytes of the container's stdout, before `started` (b"" on EOF or timeout)."""
        got = b""
        while len(got) < n:
            if not select.select([self._out_r], [], [], timeout_s)[0]:
                break
            chunk = os.read(self._out_r, n - len(got))
            if not chunk:
                break
            got += chunk
        return got

    def child_fds(self) -> tuple[int, int, int]:
        """The pipe ends runsc gets as fds 0, 1, 2."""
        return self._in_r, self._out_w, self._err_w

    def _feed(self) -> None:
        src, dst = self._src[0], self._in_w
        try:
            while src >= 0:
                ready, _, _ = select.select([src, self._stop_r], [], [])
                if self._stop_r in ready:
                    return
                try:
                    data = os.read(src, _CHUNK)
                except OSError:
                    return
                if not data or not _write_all(dst, data):
                    return
        finally:
            os.close(dst)

    def _drain(self, src: int, dst: int) -> None:
        try:
            while True:
                try:
                    data = os.read(src, _CHUNK)
                except OSError:
                    return
                if not data:
                    return
                if dst >= 0:
                    _write_all(dst, data)
        finally:
            os.close(src)

    def close_child_ends(self) -> None:
        """The child holds its ends now: close ours (so its exit is our EOF)."""
        for fd in (self._in_r, self._out_w, self._err_w):
            if fd >= 0:
                os.close(fd)
        self._in_r = self._out_w = self._err_w = -1

    def started(self) -> None:
        """The child holds its ends now: close ours, start copying."""
        self.close_child_ends()
        for target, args, own in (
            (self._feed, (), self._src[0]),
            (self._drain, (self._out_r, self._src[1]), self._src[1]),
            (self._drain, (self._err_r, self._src[2]), self._src[2]),
        ):
            t = threading.Thread(target=target, args=args, daemon=True)
            t.start()
            self._threads.append((t, own))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop feeding stdin; wait for the output to drain (every writer is dead by now)."""
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        for t, own in self._threads:
            t.join(timeout_s)
            # A thread still running keeps its duplicate: closing it under
            # the thread would free the number for another file.
            if not t.is_alive() and own >= 0:
                with contextlib.suppress(OSError):
                    os.close(own)
        for fd in (self._in_r, self._out_w, self._err_w, self._stop_r, self._stop_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._in_r = self._out_w = self._err_w = self._stop_r = self._stop_w = -1
        if not self._threads:
            for fd in (self._in_w, self._out_r, self._err_r, *self._src):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        self._threads = []
        self._src = (-1, -1, -1)
