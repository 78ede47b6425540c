"""Egress for a namespace sandbox: the broker listens *inside* its network namespace.

A namespace sandbox has no network device but its own loopback. Once bwrap
has created the namespaces (and before the command runs: bwrap waits on
`--block-fd`), corral enters the sandbox's network namespace from the host
(setns as root), creates a listening socket on the sandbox's 127.0.0.1:3128,
returns to its own namespace and hands the socket to a broker process. The
socket exists in no filesystem and no other process holds it, so when the
broker dies the sandbox's only way out is gone (connections are refused):
egress fails closed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import BrokerError, SandboxStartError

if TYPE_CHECKING:
    from corral.broker.process import BrokerProcess

__all__ = ["SANDBOX_PROXY_PORT", "EgressBroker", "listen_in_netns", "sandbox_proxy_env"]

#: The broker's port on the sandbox's own loopback.
SANDBOX_PROXY_PORT = 3128
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise SandboxStartError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


def listen_in_netns(pid: int, port: int = SANDBOX_PROXY_PORT) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:`port` in the network namespace of `pid`."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        os.close(own)
        raise SandboxStartError(
            exc.errno, f"sandbox network namespace gone: {exc.strerror}"
        ) from exc
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                sock.listen(256)
            except OSError:
                sock.close()
                raise
        finally:
            # Back to our own namespace before anything else can run on this thread.
            _setns(own)
    finally:
        os.close(target)
        os.close(own)
    return sock


def sandbox_proxy_env() -> dict[str, str]:
    """Variables that point the sandbox's clients at the broker."""
    from corral.broker.process import proxy_env

    env = proxy_env(SANDBOX_PROXY_PORT)
    env["CORRAL_BROKER_URL"] = f"http://127.0.0.1:{SANDBOX_PROXY_PORT}"
    return env


class EgressBroker:
    """Starts a broker on a sandbox's loopback once its namespaces exist.

    Use `attach` as the sandbox's network hook; `stop()` after the sandbox
    ended. `config_json` is a BrokerConfig document.
    """

    def __init__(
        self,
        config_json: str,
        journal: Path,
        *,
        run: str | None,
        session: str | None,
        env: str,
        ready_timeout_s: float = 15.0,
    ) -> None:
        self.config_json = config_json
        self.journal = journal
        self.run = run
        self.session = session
        self.env = env
        self.ready_timeout_s = ready_timeout_s
        self.process: BrokerProcess | None = None

    def attach(self, sandbox_pid: int) -> None:
        from corral.broker.config import BrokerConfig
        from corral.broker.process import start_broker

        sock = listen_in_netns(sandbox_pid)
        try:
            self.process = start_broker(
                BrokerConfig.from_json(self.config_json),
                self.journal,
                run=self.run,
                session=self.session,
                env=self.env,
                listen_fds=[sock.fileno()],
            )
        finally:
            # The broker must hold the only copy (see module docstring).
            sock.close()
        try:
            self.process.wait_ready(self.ready_timeout_s)
        except BrokerError:
            self.stop()
            raise

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stop()
