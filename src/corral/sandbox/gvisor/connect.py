"""`SandboxNet.connect` for gVisor: a relay started inside the sandbox by `runsc exec`.

The command's 127.0.0.1 is gVisor's netstack loopback: no host socket
reaches it, and a server bound there does not answer on the veth address
either. So the host starts a forwarder inside the sandbox (`runsc exec`,
as the command's uid, no capabilities) whose stdin and stdout are one end of
a fresh socketpair: it connects to 127.0.0.1:PORT inside, sends one status
byte, then copies bytes both ways; the host keeps the other end.

Why this shape: runsc re-owns the descriptors it is given as stdio (see
`gvisor.stdio`), so it only ever gets fresh socketpair and pipe ends;
`runsc exec` finds the sandbox by the pid runsc recorded, which is a pid of
the PID namespace `unshare` made, and its control socket is an abstract one
in runsc's network namespace, so the host process joins that PID, network
and mount namespace (`nsenter`). It joins the sandbox's cgroup as well, so
`kill_all()` and teardown kill it with the rest. Everything the forwarder
sends is the sandbox's data: the status byte only decides whether connect()
raises.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass

from corral.sandbox.namespace import set_pdeathsig

__all__ = ["CONNECTED", "FORWARDER", "ExecTarget", "connect", "forwarder_argv"]

#: The byte the forwarder sends once it is connected inside.
CONNECTED = b"\x00"
#: Runs under the sandbox's /usr/bin/python3 with -I -S (standard library only).
FORWARDER = (
    "import os, socket, sys, threading\n"
    "try:\n"
    "    c = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
    "except OSError:\n"
    "    os._exit(1)\n"
    "os.write(1, b'\\x00')\n"
    "def up():\n"
    "    while True:\n"
    "        d = os.read(0, 65536)\n"
    "        if not d:\n"
    "            c.shutdown(socket.SHUT_WR)\n"
    "            return\n"
    "        c.sendall(d)\n"
    "threading.Thread(target=up, daemon=True).start()\n"
    "while True:\n"
    "    d = c.recv(65536)\n"
    "    if not d:\n"
    "        os._exit(0)\n"
    "    os.write(1, d)\n"
)
_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True, slots=True)
class ExecTarget:
    """Where `runsc exec` finds a running sandbox (all known before it starts)."""

    runsc: str
    state_dir: str
    container_id: str
    uid: int
    gid: int
    #: cgroup.procs files the forwarder's host process joins.
    cgroup_procs: tuple[str, ...] = ()


def forwarder_argv(target: ExecTarget, pid1: int, port: int) -> list[str]:
    """The host command line that starts the forwarder for `port` (pure)."""
    return [
        "nsenter",
        "-t",
        str(pid1),
        "-n",
        "-p",
        "-m",
        target.runsc,
        "--root",
        target.state_dir,
        "--ignore-cgroups",
        "exec",
        "--user",
        f"{target.uid}:{target.gid}",
        "--cwd",
        "/",
        target.container_id,
        _PYTHON,
        "-I",
        "-S",
        "-c",
        FORWARDER,
        str(port),
    ]


def _pid1(holder: int) -> int:
    from corral.sandbox.gvisor.ps import sandbox_pid1

    pid1 = sandbox_pid1(holder)
    if pid1 is None:
        raise ConnectionRefusedError(0, "the gVisor sandbox is gone")
    return pid1


def _reap(proc: subprocess.Popen[bytes]) -> None:
    # stderr is the forwarder's too (sandbox data): drained and dropped.
    assert proc.stderr is not None
    with contextlib.suppress(OSError):
        while proc.stderr.read(65536):
            pass
    proc.stderr.close()
    proc.wait()


def connect(target: ExecTarget, holder: int, port: int, timeout_s: float = 30.0) -> socket.socket:
    """A socket connected to the sandbox's 127.0.0.1:`port`; ConnectionRefusedError if nothing
    listens there (or the sandbox is gone)."""
    argv = forwarder_argv(target, _pid1(holder), port)
    ours, theirs = socket.socketpair()
    procs = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in target.cgroup_procs]

    def child_setup() -> None:
        for fd in procs:
            os.write(fd, b"0")
        set_pdeathsig(signal.SIGKILL)

    try:
        proc = subprocess.Popen(
            argv,
            stdin=theirs.fileno(),
            stdout=theirs.fileno(),
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            preexec_fn=child_setup,  # noqa: PLW1509
            close_fds=True,
            cwd="/",
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
        for fd in procs:
            os.close(fd)
    threading.Thread(target=_reap, args=(proc,), daemon=True).start()
    try:
        ours.settimeout(timeout_s)
        status = ours.recv(1)
        ours.settimeout(None)
    except BaseException:
        ours.close()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    if status != CONNECTED:
        ours.close()
        raise ConnectionRefusedError(0, f"nothing listens on the gVisor sandbox's port {port}")
    return ours
