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
import json
import os
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass

from corral.sandbox.gvisor.ps import runsc_argv
from corral.sandbox.namespace import set_pdeathsig

__all__ = [
    "CONNECTED",
    "DIAL_WIRE_MAX",
    "FORWARDER",
    "LISTENER",
    "ExecDial",
    "ExecTarget",
    "connect",
    "forwarder_argv",
    "listen_relay",
]

#: The byte the forwarder sends once it is connected inside.
CONNECTED = b"\x00"
#: Runs under the sandbox's /usr/bin/python3 with -I -S (standard library only).
#: Its stdio arrive non-blocking (`runsc exec` is Go, whose poller sets
#: O_NONBLOCK on the socketpair end it hands the sentry): without making them
#: blocking a full stdout raised EAGAIN and ended the relay, so a product
#: whose reader stalled had its stream cut short instead of held.
FORWARDER = (
    "import os, socket, sys, threading\n"
    "os.set_blocking(0, True)\n"
    "os.set_blocking(1, True)\n"
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
#: `SandboxNet.listen` inside: listens on the sandbox's 127.0.0.1:PORT, says
#: CONNECTED once it does, and relays each connection to the host's listener
#: at BROKER_IP:PORT on the veth link (gvisor.net). Runs as uid 0 without
#: capabilities, so the command (another uid) can neither kill nor ptrace it.
LISTENER = (
    "import os, socket, sys, threading\n"
    "port, far = int(sys.argv[1]), sys.argv[2]\n"
    "try:\n"
    "    s = socket.create_server(('127.0.0.1', port), backlog=256)\n"
    "except OSError:\n"
    "    os._exit(1)\n"
    "os.write(1, b'\\x00')\n"
    "def pump(a, b):\n"
    "    try:\n"
    "        while d := a.recv(65536):\n"
    "            b.sendall(d)\n"
    "        b.shutdown(socket.SHUT_WR)\n"
    "    except OSError:\n"
    "        pass\n"
    "def serve(c):\n"
    "    try:\n"
    "        h = socket.create_connection((far, port))\n"
    "    except OSError:\n"
    "        c.close()\n"
    "        return\n"
    "    threading.Thread(target=pump, args=(h, c), daemon=True).start()\n"
    "    pump(c, h)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    threading.Thread(target=serve, args=(c,), daemon=True).start()\n"
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


#: The longest `ExecDial.to_wire()` form accepted: every field at its bound fits.
DIAL_WIRE_MAX = 16384
_FIELD_MAX = 512
_PROCS_MAX = 16


@dataclass(frozen=True, slots=True)
class ExecDial:
    """What a host process other than the sandbox's owner needs to `connect()`:
    the `ExecTarget` and the pid of the `unshare` holding the sandbox. All of it
    is made by the host when the sandbox starts, none read from the sandbox."""

    target: ExecTarget
    holder: int

    def to_wire(self) -> bytes:
        t = self.target
        doc = {
            "runsc": t.runsc,
            "state_dir": t.state_dir,
            "container_id": t.container_id,
            "uid": t.uid,
            "gid": t.gid,
            "cgroup_procs": list(t.cgroup_procs),
            "holder": self.holder,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_wire(cls, data: bytes) -> ExecDial | None:
        """The form `to_wire` wrote, or None for anything else (bounded, exact)."""
        if len(data) > DIAL_WIRE_MAX:
            return None
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        keys = {"runsc", "state_dir", "container_id", "uid", "gid", "cgroup_procs", "holder"}
        if not isinstance(doc, dict) or set(doc) != keys:
            return None
        texts = [doc["runsc"], doc["state_dir"], doc["container_id"]]
        procs = doc["cgroup_procs"]
        if not isinstance(procs, list) or len(procs) > _PROCS_MAX:
            return None
        if not all(
            isinstance(x, str) and 0 < len(x) <= _FIELD_MAX and "\0" not in x
            for x in (*texts, *procs)
        ):
            return None
        nums = [doc["uid"], doc["gid"], doc["holder"]]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in nums):
            return None
        if doc["holder"] == 0:
            return None
        target = ExecTarget(
            runsc=doc["runsc"],
            state_dir=doc["state_dir"],
            container_id=doc["container_id"],
            uid=doc["uid"],
            gid=doc["gid"],
            cgroup_procs=tuple(procs),
        )
        return cls(target, doc["holder"])


def forwarder_argv(
    target: ExecTarget, pid1: int, port: int, *, listen_to: str | None = None
) -> list[str]:
    """The host command line that starts the forwarder for `port` (pure); with
    `listen_to`, the LISTENER relaying the sandbox's `port` to `listen_to`:`port`."""
    user = f"{target.uid}:{target.gid}" if listen_to is None else "0:0"
    code = FORWARDER if listen_to is None else LISTENER
    return runsc_argv(
        target.runsc,
        target.state_dir,
        pid1,
        "exec",
        "--user",
        user,
        "--cwd",
        "/",
        target.container_id,
        _PYTHON,
        "-I",
        "-S",
        "-c",
        code,
        str(port),
        *(() if listen_to is None else (listen_to,)),
    )


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
    ours = _start(forwarder_argv(target, _pid1(holder), port), target, timeout_s)
    if ours is None:
        raise ConnectionRefusedError(0, f"nothing listens on the gVisor sandbox's port {port}")
    return ours


def listen_relay(
    target: ExecTarget, holder: int, port: int, far: str, timeout_s: float = 60.0
) -> socket.socket:
    """Start the LISTENER for `port` and return once it listens inside (the returned
    socket is its stdio; closing it does not stop it: teardown does)."""
    sock = _start(forwarder_argv(target, _pid1(holder), port, listen_to=far), target, timeout_s)
    if sock is None:
        raise OSError(0, f"cannot listen on the gVisor sandbox's port {port}")
    return sock


def _start(argv: list[str], target: ExecTarget, timeout_s: float) -> socket.socket | None:
    """Run `argv` with a socketpair as its stdio; our end once it sent CONNECTED, else None."""
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
        return None
    return ours
