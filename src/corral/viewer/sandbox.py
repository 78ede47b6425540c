"""The viewer sandbox: headless Chromium, read-only, no egress, the product port only.

Like a verifier, the viewer sandbox has no network device besides its own
loopback: corral's forwarder listens on its 127.0.0.1:PRODUCT_PORT and relays
each (journaled) connection to the product's sandbox. Chromium's DevTools
endpoint listens on the viewer's own loopback (127.0.0.1:9222) and corral
reaches it through `SandboxNet.connect`, so there is no host TCP port the
product could reach. Chromium's own sandbox is off (`--no-sandbox`): the
sandbox is corral's (namespaces, seccomp, Landlock, cgroup limits).
"""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corral.sandbox.spec import Limits, NetworkSpec, SandboxSpec

if TYPE_CHECKING:
    from corral.run.forward import PortForwarder
    from corral.sandbox.backend import Backend, Sandbox, SandboxNet
    from corral.sandbox.spec import ExecResult

__all__ = [
    "CHROMIUM",
    "DEVTOOLS_PORT",
    "ViewerLimits",
    "ViewerSandbox",
    "chromium_argv",
    "viewer_spec",
]

# Debian's browser binary itself: the /usr/bin/chromium launcher script adds
# `--enable-remote-extensions` and loads extensions from /etc/chromium.d, and
# it exits when /proc/cpuinfo is not what it expects.
CHROMIUM = "/usr/lib/chromium/chromium"
DEVTOOLS_PORT = 9222
PROFILE = "/tmp/corral-viewer-profile"


@dataclass(frozen=True, slots=True)
class ViewerLimits:
    memory_bytes: int = 1024 * 1024 * 1024
    pids: int = 512


def chromium_argv(width: int, height: int) -> tuple[str, ...]:
    """Chromium's command line in the viewer sandbox (a fresh tuple each call)."""
    return (
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        "--mute-audio",
        "--password-store=basic",
        f"--user-data-dir={PROFILE}",
        f"--window-size={width},{height}",
        f"--remote-debugging-port={DEVTOOLS_PORT}",
        "--remote-debugging-address=127.0.0.1",
        "about:blank",
    )


def viewer_spec(
    scratch: Path,
    *,
    width: int,
    height: int,
    limits: ViewerLimits,
    run_id: str | None,
    session_id: str | None,
) -> SandboxSpec:
    """The viewer sandbox: nothing writable but its tmpfs and an empty scratch dir.

    Chromium's output goes to /dev/null inside the sandbox: it is product-
    influenced text the host has no use for and must not store unbounded.
    """
    script = 'exec </dev/null >/dev/null 2>&1; exec "$@"'
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
    }
    return SandboxSpec(
        argv=("/bin/sh", "-c", script, "corral-viewer", *chromium_argv(width, height)),
        workspace=str(scratch),
        env=tuple(sorted(env.items())),
        limits=Limits(memory_bytes=limits.memory_bytes, pids=limits.pids),
        network=NetworkSpec(),
        env_kind="verifier",
        hostname="viewer",
        run_id=run_id,
        session_id=session_id,
    )


class ViewerSandbox:
    """A started viewer sandbox with the product port forwarded into it."""

    def __init__(
        self,
        backend: Backend,
        spec: SandboxSpec,
        *,
        product: SandboxNet,
        product_port: int,
        forwarder: PortForwarder,
        parent_cgroup: str | None,
    ) -> None:
        self._stops: list[Callable[[], None]] = []
        holder: list[SandboxNet] = []

        def hook(net: SandboxNet) -> None:
            holder.append(net)
            self._stops.append(forwarder.expose(net.listen(product_port), product, product_port))

        self.sandbox: Sandbox = backend.start(spec, parent_cgroup=parent_cgroup, network=hook)
        self.net: SandboxNet = holder[0]

    def devtools(self) -> socket.socket:
        """A socket to Chromium's DevTools endpoint on the viewer's own loopback."""
        return self.net.connect(DEVTOOLS_PORT)

    def peak_memory(self) -> int:
        usage = self.sandbox.usage()
        return usage.peak_memory_bytes if usage is not None else 0

    def close(self) -> ExecResult | None:
        result = None
        with contextlib.suppress(Exception):
            result = self.sandbox.interrupt(signal.SIGKILL)
        for stop in self._stops:
            stop()
        self.sandbox.close()
        return result
