"""Egress for a sandbox: the broker listens on the sandbox's own loopback.

A sandbox has no network device but its own loopback. Once the backend has
built it (and before the command runs), the backend hands corral the
sandbox's `SandboxNet`; corral gets a listening socket on the sandbox's
127.0.0.1:3128 from it (for a namespace sandbox, created inside its network
namespace: `sandbox/netns.py`) and hands the socket to a broker process. The
socket exists in no filesystem and no other process holds it, so when the
broker dies the sandbox's only way out is gone (connections are refused):
egress fails closed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from corral.broker.proxy_env import SANDBOX_PROXY_PORT, sandbox_proxy_env

if TYPE_CHECKING:
    import socket

    from corral.broker.process import BrokerProcess

__all__ = ["SANDBOX_PROXY_PORT", "EgressBroker", "Listener", "sandbox_proxy_env"]


class Listener(Protocol):
    """What the broker needs of a sandbox: a listening socket on its own loopback.

    A backend's `SandboxNet` satisfies it; declared here so that the broker
    depends on no sandbox module.
    """

    def listen(self, port: int) -> socket.socket: ...


class EgressBroker:
    """Starts a broker on a sandbox's loopback once its namespaces exist.

    Use `attach` as the backend's `network` callback; `stop()` after the sandbox
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
        control: Path | None = None,
    ) -> None:
        self.config_json = config_json
        self.journal = journal
        self.run = run
        self.session = session
        self.env = env
        self.ready_timeout_s = ready_timeout_s
        self.control = control
        self.process: BrokerProcess | None = None

    def attach(self, net: Listener) -> None:
        from corral.broker.config import BrokerConfig
        from corral.broker.process import start_broker

        sock = net.listen(SANDBOX_PROXY_PORT)
        try:
            self.process = start_broker(
                BrokerConfig.from_json(self.config_json),
                self.journal,
                run=self.run,
                session=self.session,
                env=self.env,
                listen_fds=[sock.fileno()],
                control=self.control,
            )
        finally:
            # The broker must hold the only copy (see module docstring).
            sock.close()
        try:
            self.process.wait_ready(self.ready_timeout_s)
        except BaseException:
            # Also on an interrupt while waiting: no broker may outlive a failed attach.
            self.stop()
            raise

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stop()
