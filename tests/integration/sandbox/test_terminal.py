"""M14: the caller's terminal is out of the sandbox's reach; a corral pty is relayed.

Each test runs `corral exec` on a fresh pty the test owns, under a host
"shell" that is the session leader of that pty, sits in its foreground
process group and counts the SIGWINCHs it receives. The oracles are the
host pty's own state (window size, termios, exclusive flag) and that count.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import corral_argv

pytestmark = [pytest.mark.requires_sandbox]

_TIOCGEXCL = 0x80045440

#: The host shell: session leader of the pty, SIGWINCH counter, reports on argv[2].
_SHELL = r"""
import fcntl, json, os, signal, sys, termios
tty, report, background = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "bg"
os.setsid()
fcntl.ioctl(tty, termios.TIOCSCTTY, 0)
winch = [0]
signal.signal(signal.SIGWINCH, lambda *_: winch.__setitem__(0, winch[0] + 1))
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGWINCH, signal.SIG_DFL)
    if background:
        os.setpgid(0, 0)
    for fd in range(3):
        os.dup2(tty, fd)
    os.close(report)
    os.execv(sys.argv[4], sys.argv[4:])
_, status = os.waitpid(pid, 0)
doc = {"winch": winch[0], "exit": os.waitstatus_to_exitcode(status)}
os.write(report, json.dumps(doc).encode())
"""


@dataclass(frozen=True)
class Session:
    exit: int
    winch: int
    output: bytes


class HostPty:
    """A pty the test owns; `run` starts corral exec on it under the host shell."""

    def __init__(self, rows: int = 24, cols: int = 80) -> None:
        self.master, self.slave = os.openpty()
        termios.tcsetwinsize(self.master, (rows, cols))

    def close(self) -> None:
        os.close(self.master)
        os.close(self.slave)

    def run(
        self,
        workspace: Path,
        script: str,
        *,
        launcher: list[str] | None = None,
        typed: tuple[tuple[bytes, bytes], ...] = (),
        on_ready: tuple[bytes, Callable[[], None]] | None = None,
        background: bool = False,
    ) -> Session:
        """Run `sh -c script` (under `launcher`, default corral exec) on the pty.

        When the output shows a `typed` key, its keystrokes are typed (in
        order); `on_ready` runs its action once the output shows its key.
        """
        report_r, report_w = os.pipe()
        argv = [
            sys.executable,
            "-c",
            _SHELL,
            str(self.slave),
            str(report_w),
            "bg" if background else "fg",
            *(launcher or corral_argv("--workspace", str(workspace), "--")),
            "/bin/sh",
            "-c",
            script,
        ]
        proc = subprocess.Popen(
            argv, pass_fds=(self.slave, report_w), close_fds=True, stdin=subprocess.DEVNULL
        )
        os.close(report_w)
        self.shell_pid = proc.pid
        out = b""
        todo = list(typed)
        report = b""
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([self.master, report_r], [], [], 1.0)
                if self.master in ready:
                    with contextlib.suppress(OSError):
                        out += os.read(self.master, 65536)
                while todo and todo[0][0] in out:
                    key, keys = todo.pop(0)
                    out = out.replace(key, b"<" + key.strip(b"@") + b">", 1)
                    os.write(self.master, keys)
                if on_ready is not None and on_ready[0] in out:
                    action = on_ready[1]
                    on_ready = None
                    action()
                if report_r in ready:
                    chunk = os.read(report_r, 4096)
                    if not chunk:
                        break
                    report += chunk
            proc.wait(timeout=30)
        finally:
            os.close(report_r)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # What is still queued on the master after the sandbox ended.
        os.set_blocking(self.master, False)
        try:
            while chunk := os.read(self.master, 65536):
                out += chunk
        except OSError:
            pass
        os.set_blocking(self.master, True)
        doc = json.loads(report.decode())
        return Session(exit=int(doc["exit"]), winch=int(doc["winch"]), output=out)


@pytest.fixture
def host_pty() -> Iterator[HostPty]:
    pty = HostPty()
    yield pty
    pty.close()


def _py(code: str) -> str:
    return f"/usr/bin/python3 -I -S -c {shlex.quote(code)}"


def test_sandbox_resize_does_not_reach_the_host_terminal(
    host_pty: HostPty, workspace: Path
) -> None:
    before = termios.tcgetwinsize(host_pty.master)
    code = (
        "import fcntl,struct,termios\n"
        "for fd in (0, 1, 2):\n"
        "    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', 7, 13, 0, 0))\n"
        "print('sized')"
    )
    s = host_pty.run(workspace, _py(code))
    assert s.exit == 0, s.output
    assert b"sized" in s.output
    assert s.winch == 0, "the sandbox signalled the host's foreground process group"
    assert termios.tcgetwinsize(host_pty.master) == before


def test_sandbox_echo_off_does_not_outlive_it(host_pty: HostPty, workspace: Path) -> None:
    before = termios.tcgetattr(host_pty.slave)
    s = host_pty.run(workspace, "stty raw -echo; echo done")
    assert s.exit == 0, s.output
    assert b"done" in s.output
    assert termios.tcgetattr(host_pty.slave) == before


def test_sandbox_cannot_lock_the_host_terminal(host_pty: HostPty, workspace: Path) -> None:
    code = (
        "import fcntl,termios\n"
        "for fd in (0, 1, 2):\n"
        "    fcntl.ioctl(fd, termios.TIOCEXCL)\n"
        "print('locked')"
    )
    s = host_pty.run(workspace, _py(code))
    assert s.exit == 0, s.output
    assert b"locked" in s.output
    flag = struct.unpack("i", fcntl.ioctl(host_pty.slave, _TIOCGEXCL, b"\0" * 4))[0]
    assert flag == 0, "TIOCEXCL reached the caller's terminal"


def test_tiocsti_is_still_refused(host_pty: HostPty, workspace: Path) -> None:
    code = (
        "import fcntl,termios\n"
        "try:\n"
        "    fcntl.ioctl(0, termios.TIOCSTI, b'Z')\n"
        "    print('injected')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)"
    )
    s = host_pty.run(workspace, _py(code))
    assert b"refused 1" in s.output, s.output
    # Nothing was queued as input on the host terminal.
    os.set_blocking(host_pty.slave, False)
    try:
        queued = os.read(host_pty.slave, 100)
    except BlockingIOError:
        queued = b""
    finally:
        os.set_blocking(host_pty.slave, True)
    assert b"Z" not in queued


def test_typed_input_reaches_the_sandbox_and_ctrl_d_ends_it(
    host_pty: HostPty, workspace: Path
) -> None:
    s = host_pty.run(
        workspace,
        "echo '@ask@'; read line; echo \"got:$line\"; cat; echo eof-seen; exit 3",
        typed=((b"@ask@", b"hello\r"), (b"got:hello", b"more\r\x04")),
    )
    assert s.exit == 3, s.output
    assert b"got:hello" in s.output
    assert b"eof-seen" in s.output


def test_host_resize_reaches_the_sandbox(host_pty: HostPty, workspace: Path) -> None:
    s = host_pty.run(
        workspace,
        "echo '@ask@'; read line; stty size",
        on_ready=(b"@ask@", lambda: _resize_then_type(host_pty)),
    )
    assert s.exit == 0, s.output
    assert b"41 99" in s.output


def _resize_then_type(pty: HostPty) -> None:
    # The resize signals corral before the line is written, so corral has
    # copied the size onto the sandbox's pty before `stty size` runs.
    termios.tcsetwinsize(pty.master, (41, 99))
    os.write(pty.master, b"x\r")


def test_only_the_terminal_streams_go_through_the_pty(host_pty: HostPty, workspace: Path) -> None:
    # stdout is a file: it stays a file, byte-exact, while stdin is relayed.
    out = workspace.parent / "out.bin"
    payload = "\\001\\033[2J\\r\\n\\377"
    s = host_pty.run(
        workspace,
        "test -t 1 && echo stdout-is-a-tty >&2; echo @ask@ >&2; read x; "
        f"printf '{payload}%s' \"$x\"",
        launcher=[
            "/bin/sh",
            "-c",
            f'exec "$@" >{shlex.quote(str(out))}',
            "sh",
            *corral_argv("--workspace", str(workspace), "--"),
        ],
        typed=((b"@ask@", b"typed\r"),),
    )
    assert s.exit == 0, s.output
    assert b"stdout-is-a-tty" not in s.output
    assert out.read_bytes() == b"\001\033[2J\r\n\377typed"


_LAUNCH_IN_PROCESS = """
import sys
from corral.sandbox.namespace import NamespaceSandbox
from corral.sandbox.spec import SandboxSpec
env = (("PATH", "/usr/bin:/bin"),)
spec = SandboxSpec(argv=tuple(sys.argv[2:]), workspace=sys.argv[1], env=env)
sys.exit(NamespaceSandbox(spec).start().wait().exit)
"""


def test_in_process_sandboxes_get_no_terminal(host_pty: HostPty, workspace: Path) -> None:
    # What `corral run` does: NamespaceSandbox(spec).start() from a process
    # whose stdio is the caller's terminal.
    before = termios.tcgetattr(host_pty.slave)
    code = (
        "import fcntl,os,struct,termios\n"
        "ttys = [fd for fd in (0, 1, 2) if os.isatty(fd)]\n"
        "open('ttys', 'w').write(repr(ttys))\n"
        "for fd in ttys:\n"
        "    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', 7, 13, 0, 0))\n"
        "    os.system('stty raw -echo <&%d' % fd)"
    )
    s = host_pty.run(
        workspace,
        _py(code),
        launcher=[sys.executable, "-c", _LAUNCH_IN_PROCESS, str(workspace)],
    )
    assert s.exit == 0, s.output
    assert (workspace / "ttys").read_text() == "[]"
    assert s.winch == 0
    assert termios.tcgetwinsize(host_pty.master) == (24, 80)
    assert termios.tcgetattr(host_pty.slave) == before


def _corral_pid(pty: HostPty) -> int:
    """The corral process: the host shell's only child."""
    children = Path(f"/proc/{pty.shell_pid}/task/{pty.shell_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_terminal_is_restored_when_corral_is_terminated(host_pty: HostPty, workspace: Path) -> None:
    before = termios.tcgetattr(host_pty.slave)
    s = host_pty.run(
        workspace,
        "echo @ask@; exec sleep 100",
        on_ready=(b"@ask@", lambda: os.kill(_corral_pid(host_pty), signal.SIGTERM)),
    )
    assert s.exit == 128 + signal.SIGTERM, s.output
    assert termios.tcgetattr(host_pty.slave) == before


def test_terminal_is_restored_when_the_sandbox_is_refused(
    host_pty: HostPty, workspace: Path
) -> None:
    before = termios.tcgetattr(host_pty.slave)
    s = host_pty.run(
        workspace,
        "true",
        launcher=[
            "/usr/bin/env",
            "CORRAL_UID_RANGE=bogus",
            *corral_argv("--workspace", str(workspace), "--"),
        ],
    )
    assert s.exit == 125, s.output
    assert b"CORRAL_UID_RANGE" in s.output
    assert termios.tcgetattr(host_pty.slave) == before


def test_a_background_corral_is_not_stopped_and_gives_eof(
    host_pty: HostPty, workspace: Path
) -> None:
    # `corral exec ... &` from an interactive shell: changing the terminal's
    # modes or reading it from the background would stop corral (SIGTTOU,
    # SIGTTIN); the sandbox gets end of input instead.
    before = termios.tcgetattr(host_pty.slave)
    s = host_pty.run(workspace, "read x || echo no-input; echo done", background=True)
    assert s.exit == 0, s.output
    assert b"no-input" in s.output and b"done" in s.output
    assert termios.tcgetattr(host_pty.slave) == before
