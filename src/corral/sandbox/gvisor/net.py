"""Egress for a gVisor sandbox: one veth link, the broker alone at its far end.

gVisor's netstack has its own loopback, which no host socket can listen on.
With `--network=sandbox` runsc takes every interface of the network
namespace it starts in; corral starts it in a fresh namespace holding only
`veth-g` (BROKER_NET .2). The peer `veth-b` (.1) lives in a second fresh
namespace in which the broker's listening socket is the only socket, so the
sandbox reaches the broker at BROKER_IP:3128 and nothing else: no route
leaves the /30, the host's namespace is not on the link, and when the
broker dies nothing listens there any more (connections are refused).

runsc 20221219 refuses `--network=sandbox` when /proc/sys/net/core/rmem_default
exists (its test for "the root network namespace"); kernels since 6.x show
that file in every namespace, so runsc's own mount namespace gets an empty
tmpfs over /proc/sys/net/core (`runsc_prelude`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess

from corral.errors import SandboxStartError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.sandbox.gvisor.connect import ExecDial, ExecTarget

__all__ = ["BROKER_IP", "SANDBOX_IP", "BrokerLink", "rewrite_proxy_env", "runsc_prelude"]

BROKER_IP = "10.200.0.1"
SANDBOX_IP = "10.200.0.2"


def runsc_prelude(block_fd: int) -> list[str]:
    """pid 1 of runsc's PID namespace, before runsc: `sh -c SCRIPT sh runsc ...`.

    It waits until corral has built the link (`block_fd` says "1"; EOF if
    corral died first), hides rmem_default from runsc, then becomes runsc.
    """
    script = (
        f'read -r go <&{block_fd} && [ "$go" = 1 ] && exec {block_fd}<&- &&'
        ' mount -t tmpfs -o size=4k corral-net /proc/sys/net/core && exec "$@"'
    )
    return ["/bin/sh", "-c", script, "sh"]


_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def rewrite_proxy_env(env: tuple[tuple[str, str], ...], port: int) -> tuple[tuple[str, str], ...]:
    """The spec's proxy variables pointed at BROKER_IP instead of the sandbox's loopback (pure)."""
    old = f"127.0.0.1:{port}"
    return tuple((k, v.replace(old, f"{BROKER_IP}:{port}")) for k, v in env)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise SandboxStartError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


def _ip(pid: int, script: str) -> None:
    proc = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "sh", "-ec", script],
        capture_output=True,
        timeout=10,
        check=False,
    )
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip()[-300:]
        raise SandboxStartError(0, f"cannot set up the gVisor sandbox's link: {detail}")


class BrokerLink:
    """The broker's end of the link; a `SandboxNet` whose listen() binds BROKER_IP (and,
    once the sandbox runs, `start_relays` relays the sandbox's own 127.0.0.1 there)
    and whose connect() reaches the sandbox's own 127.0.0.1 through `target`
    (gvisor.connect); `exec_dial()` lets the run's forward helper do that
    connect() itself (an `ExecNet`).

    `sandbox_pid` is a process in the namespace runsc will start in (it
    must not have started runsc yet). Call `close()` once the broker holds
    its socket: the helper that kept the broker's namespace alive exits,
    and the namespace then lives exactly as long as the broker's socket.
    """

    def __init__(self, sandbox_pid: int, target: ExecTarget | None = None) -> None:
        self._sandbox_pid = sandbox_pid
        self._target = target
        #: Ports listen() bound; each gets a relay inside once the sandbox runs.
        self.ports: list[int] = []
        self._r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                os.close(self._r)
                if _libc.unshare(_CLONE_NEWNET) != 0:
                    os._exit(1)
                os.write(w, b"1")
                signal.pause()  # until close() kills it
            finally:
                os._exit(0)
        os.close(w)
        self.helper = pid
        try:
            if os.read(self._r, 1) != b"1":
                raise SandboxStartError(0, "the broker namespace helper failed")
            _ip(
                sandbox_pid,
                "ip link set lo up\n"
                f"ip link add veth-g type veth peer name veth-b netns {pid}\n"
                f"ip addr add {SANDBOX_IP}/30 dev veth-g\n"
                "ip link set veth-g up\n",
            )
            _ip(pid, f"ip addr add {BROKER_IP}/30 dev veth-b\nip link set veth-b up\n")
        except BaseException:
            self.close()
            raise

    def listen(self, port: int) -> socket.socket:
        own = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        target = os.open(f"/proc/{self.helper}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    sock.bind((BROKER_IP, port))
                    sock.listen(256)
                except OSError:
                    sock.close()
                    raise
            finally:
                # Back home before anything else runs on this thread.
                _setns(own)
        finally:
            os.close(target)
            os.close(own)
        self.ports.append(port)
        return sock

    def start_relays(self) -> list[socket.socket]:
        """Once the sandbox runs: a relay inside per listen()ed port, so the command's
        127.0.0.1:port reaches the host's listener (gvisor.connect.LISTENER)."""
        if self._target is None or not self.ports:
            return []
        from corral.sandbox.gvisor.connect import listen_relay

        out: list[socket.socket] = []
        try:
            for port in self.ports:
                out.append(listen_relay(self._target, self._sandbox_pid, port, BROKER_IP))
        except BaseException:
            for s in out:
                s.close()
            raise
        return out

    def connect(self, port: int) -> socket.socket:
        """Through a forwarder inside the sandbox (`gvisor.connect`); valid after close() too."""
        if self._target is None:
            raise ConnectionRefusedError(0, "no runsc exec target for this link")
        from corral.sandbox.gvisor.connect import connect

        return connect(self._target, self._sandbox_pid, port)

    def exec_dial(self) -> ExecDial | None:
        """What another host process needs to `connect()` as this link does (`ExecNet`)."""
        if self._target is None:
            return None
        from corral.sandbox.gvisor.connect import ExecDial

        return ExecDial(self._target, self._sandbox_pid)

    def close(self) -> None:
        if self.helper > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.helper, 9)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.helper, 0)
            self.helper = 0
        with contextlib.suppress(OSError):
            os.close(self._r)
