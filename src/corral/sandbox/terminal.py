"""The caller's terminal never reaches a sandbox; a corral-owned pty does.

A terminal descriptor is a channel to every process of its session: through
it TIOCSWINSZ signals the foreground process group (SIGWINCH), TCSETS leaves
echo off after the sandbox exits, TIOCEXCL locks the user out of their own
terminal. So no sandbox gets a descriptor of the caller's terminal:

* `corral exec` with a terminal on stdin, stdout or stderr gives the sandbox
  a fresh pty (`PtyRelay`): exactly the standard streams that were terminals
  become the pty's slave, the others (pipes, files) pass through untouched.
  Corral copies bytes between the caller's terminal and the pty's master and
  copies the caller's window size onto the pty when the host resizes it; the
  sandbox's ioctls act on its own pty only.
* every other launch (`corral run`'s sandboxes, `stdio_without_tty`) gets
  /dev/null in place of any standard stream that is a terminal.

The pty isolates ioctls, not content: what the sandbox writes is relayed to
the caller's terminal byte for byte, escape sequences included, because
that is what a terminal session is.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import termios
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from types import FrameType
    from typing import Any

__all__ = ["PtyRelay", "StdioPlan", "may_use_terminal", "plan_stdio", "stdio_without_tty"]

_CHUNK = 65536
_VDISABLE = 0  # Linux's _POSIX_VDISABLE
_STOP_JOIN_S = 5.0


@dataclass(frozen=True, slots=True)
class StdioPlan:
    """Which standard streams go through the pty, and which host tty fds are relayed.

    `through_pty[i]` is true when fd i is a terminal and becomes the pty's
    slave; `host_in` is the terminal fd whose input is copied into the pty
    (None when stdin is not a terminal); `host_out` receives the pty's output
    and is the terminal whose window size the pty follows. `null_stdin`:
    stdin is a terminal corral may not read (corral runs in the background
    of its job-control session), so the sandbox gets /dev/null instead.
    """

    through_pty: tuple[bool, bool, bool]
    host_in: int | None
    host_out: int
    null_stdin: bool = False

    @property
    def needed(self) -> bool:
        return any(self.through_pty)


def plan_stdio(is_tty: tuple[bool, bool, bool], *, foreground: bool = True) -> StdioPlan | None:
    """The relay for these standard streams, or None when none is a terminal.

    `foreground`: corral may read its terminal stdin and change its modes
    (it is in the terminal's foreground process group, or the terminal is
    not its controlling terminal). A background corral doing either would
    be stopped by SIGTTIN/SIGTTOU.
    """
    if not any(is_tty):
        return None
    host_out = next(fd for fd in (1, 2, 0) if is_tty[fd])
    if is_tty[0] and not foreground:
        return StdioPlan((False, is_tty[1], is_tty[2]), None, host_out, null_stdin=True)
    return StdioPlan(through_pty=is_tty, host_in=0 if is_tty[0] else None, host_out=host_out)


def may_use_terminal(fd: int) -> bool:
    """Whether reading `fd` or changing its modes leaves corral running (see plan_stdio)."""
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:  # ENOTTY: not corral's controlling terminal, no job control applies
        return True


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def stdio_without_tty() -> tuple[tuple[int | None, int | None, int | None], int | None]:
    """Popen stdio that inherits fds 0-2 except terminals, which become /dev/null.

    Returns (stdio, the /dev/null fd to close after the spawn or None).
    """
    ttys = [_isatty(fd) for fd in range(3)]
    if not any(ttys):
        return (None, None, None), None
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    s0, s1, s2 = (null if t else None for t in ttys)
    return (s0, s1, s2), null


def _host_raw(attrs: list[Any]) -> list[Any]:
    """The caller's termios for relaying: raw, except that ^C still signals corral.

    The sandbox is its own session without a controlling terminal, so a
    keyboard signal typed into its pty would reach nobody; ISIG stays on so
    ^C interrupts corral, which kills the sandbox (exit 130) as without a
    pty. Quit and suspend are disabled: a corral stopped or dumped in raw
    mode would leave the terminal raw.
    """
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = attrs
    iflag &= ~(
        termios.IGNBRK
        | termios.BRKINT
        | termios.PARMRK
        | termios.ISTRIP
        | termios.INLCR
        | termios.IGNCR
        | termios.ICRNL
        | termios.IXON
    )
    oflag &= ~termios.OPOST
    cflag = (cflag & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
    lflag &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.IEXTEN)
    cc = list(cc)
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    for key in (termios.VQUIT, termios.VSUSP):
        cc[key] = bytes([_VDISABLE])
    return [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class PtyRelay:
    """A pty for one sandbox and the thread that relays it. `open()`, then `close()`.

    Use: `relay = PtyRelay.open(plan)`; pass `relay.stdio` to the launcher;
    `relay.spawned()` once the sandbox runs; `relay.close()` on every path
    (restores the caller's terminal, drains the sandbox's last output).
    """

    def __init__(self, plan: StdioPlan, master: int, slave: int) -> None:
        self.plan = plan
        self._master = master
        self._slave: int | None = slave
        self._saved: list[Any] | None = None
        self._old_winch: object = None
        self._thread: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) if plan.null_stdin else None
        self._closed = False

    @classmethod
    def open(cls, plan: StdioPlan) -> PtyRelay:
        master, slave = os.openpty()
        os.set_inheritable(master, False)
        os.set_inheritable(slave, False)
        relay = cls(plan, master, slave)
        try:
            host = plan.host_out
            with contextlib.suppress(termios.error):
                termios.tcsetattr(slave, termios.TCSANOW, termios.tcgetattr(host))
            relay._copy_size()
        except BaseException:
            relay.close()
            raise
        return relay

    @property
    def stdio(self) -> tuple[int | None, int | None, int | None]:
        """Popen stdin/stdout/stderr: the slave for streams that were terminals."""
        assert self._slave is not None
        s0, s1, s2 = (self._slave if t else None for t in self.plan.through_pty)
        return (self._null if self._null is not None else s0), s1, s2

    def _copy_size(self) -> None:
        with contextlib.suppress(OSError):
            size = termios.tcgetwinsize(self.plan.host_out)
            termios.tcsetwinsize(self._master, size)

    def _on_winch(self, _signum: int, _frame: FrameType | None) -> None:
        self._copy_size()

    def start(self) -> None:
        """Raw mode on the caller's terminal, forward resizes, start relaying."""
        import threading

        if self.plan.host_in is not None:
            with contextlib.suppress(termios.error):
                saved = termios.tcgetattr(self.plan.host_in)
                termios.tcsetattr(self.plan.host_in, termios.TCSADRAIN, _host_raw(saved))
                self._saved = saved
        # Signal handlers run in the main thread; the resize is one ioctl.
        self._old_winch = signal.signal(signal.SIGWINCH, self._on_winch)
        self._copy_size()
        self._thread = threading.Thread(target=self._pump, name="corral-pty", daemon=True)
        # A process-directed signal goes to any thread not blocking it; one
        # taken by the relay thread would leave the main thread asleep in
        # waitpid and the handler (a resize, corral exec's SIGTERM) unrun.
        # The thread inherits the mask it was created with.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            self._thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def spawned(self) -> None:
        """Drop corral's copy of the slave, so the master sees EOF when the sandbox ends."""
        if self._slave is not None:
            os.close(self._slave)
            self._slave = None

    def _pump(self) -> None:
        master, host_in, host_out = self._master, self.plan.host_in, self.plan.host_out
        os.set_blocking(master, False)
        pending = b""
        reading_host = host_in is not None
        while True:
            rlist = [master, self._stop_r]
            if reading_host and not pending:
                assert host_in is not None
                rlist.append(host_in)
            wlist = [master] if pending else []
            try:
                ready_r, ready_w, _ = select.select(rlist, wlist, [])
            except OSError:
                return
            if self._stop_r in ready_r:
                return
            if master in ready_r:
                try:
                    data = os.read(master, _CHUNK)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: every slave fd is closed, the sandbox is gone
                    return
                if not data:
                    return
                try:
                    _write_all(host_out, data)
                except OSError:
                    return
            if master in ready_w and pending:
                try:
                    n = os.write(master, pending)
                    pending = pending[n:]
                except BlockingIOError:
                    pass
                except OSError:
                    return
            if host_in is not None and host_in in ready_r:
                try:
                    data = os.read(host_in, _CHUNK)
                except OSError:
                    data = b""
                if data:
                    # A resize the host made before this keystroke reaches
                    # the pty before the keystroke does, whichever thread
                    # the scheduler runs first.
                    self._copy_size()
                    pending = data
                else:
                    reading_host = False

    def close(self) -> None:
        """Drain and stop the relay, restore the caller's terminal and SIGWINCH, close fds."""
        if self._closed:
            return
        self._closed = True
        try:
            self.spawned()
            if self._thread is not None:
                # The sandbox is torn down by now, so the master reaches EOF
                # once its output is drained; the stop pipe bounds the wait
                # should a process outside the cgroup still hold the slave.
                self._thread.join(_STOP_JOIN_S)
                os.write(self._stop_w, b"x")
                # A thread blocked writing to a terminal nobody reads is
                # left behind (a daemon thread): corral's exit must not wait.
                self._thread.join(_STOP_JOIN_S)
        finally:
            if self._saved is not None and self.plan.host_in is not None:
                # Should corral have been moved to the background meanwhile,
                # the restore must not stop it (SIGTTOU) in raw mode.
                old_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                try:
                    with contextlib.suppress(termios.error):
                        termios.tcsetattr(self.plan.host_in, termios.TCSADRAIN, self._saved)
                finally:
                    signal.signal(signal.SIGTTOU, old_ttou)
            if self._thread is not None:
                signal.signal(signal.SIGWINCH, self._old_winch)  # type: ignore[arg-type]
            for fd in (self._master, self._stop_r, self._stop_w, self._null):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
