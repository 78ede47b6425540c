"""Egress for a sandbox: the broker listens on the sandbox's own loopback.

A sandbox has no network device but its own loopback. Once the backend has
built it (and before the command runs), the backend hands corral the
sandbox's `SandboxNet`; corral gets a listening socket on the sandbox's
127.0.0.1:3128 from it (for a namespace sandbox, created inside its network
namespace: `sandbox/netns.py`) and hands the socket to a broker process. The
socket exists in no filesystem and no other process holds it, so when the
broker dies the sandbox's only way out is gone (connections are refused):
egress fails closed.

With `resident=True` the socket goes to the per-user resident broker
(`broker/resident.py`) instead of a fresh process: the same only-copy rule
holds (the launcher closes its copy once the resident answered), so the
resident's death cuts egress the same way.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from corral.broker.proxy_env import SANDBOX_PROXY_PORT, sandbox_proxy_env

if TYPE_CHECKING:
    import socket

    from corral.broker.process import BrokerProcess
    from corral.broker.resident import Attachment

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
        resident: bool = False,
        resident_socket: Path | None = None,
        resident_idle_s: float = 30.0,
    ) -> None:
        self.config_json = config_json
        self.journal = journal
        self.run = run
        self.session = session
        self.env = env
        self.ready_timeout_s = ready_timeout_s
        self.control = control
        self.process: BrokerProcess | None = None
        self.resident = resident
        self.resident_socket = resident_socket
        self.resident_idle_s = resident_idle_s
        self.attachment: Attachment | None = None

    def attach(self, net: Listener) -> None:
        if self.resident:
            self._attach_resident(net)
            return
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

    def _attach_resident(self, net: Listener) -> None:
        from corral.broker.resident import attach_resident

        sock = net.listen(SANDBOX_PROXY_PORT)
        try:
            self.attachment = attach_resident(
                sock,
                self.config_json,
                self.journal,
                run=self.run,
                session=self.session,
                env=self.env,
                control=self.control,
                socket_path=self.resident_socket,
                idle_s=self.resident_idle_s,
                timeout_s=self.ready_timeout_s,
            )
        finally:
            # The resident must hold the only copy (see module docstring).
            sock.close()

    def alive(self) -> bool:
        if self.attachment is not None:
            return self.attachment.alive()
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.attachment is not None:
            attachment, self.attachment = self.attachment, None
            if not attachment.detach():
                import sys

                sys.stderr.write(
                    f"corral: the resident broker (pid {attachment.pid}) died while the "
                    "sandbox ran: its egress was cut from then on\n"
                )
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stop()
