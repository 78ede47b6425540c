"""The viewer sandbox: headless Chromium, read-only, no egress, the product port only.

Like a verifier, the viewer sandbox has no network device besides its own
loopback: corral's forward helper listens on its 127.0.0.1:PRODUCT_PORT and
relays each (journaled) connection to the product's sandbox. Chromium speaks
DevTools over `--remote-debugging-pipe` on its fds 3 and 4, which are the
sandbox's stdin and stdout: pipes only corral holds. No DevTools port
exists, neither on the host nor on the viewer's loopback, where the
product's own JavaScript could reach it. Chromium's own sandbox is off (`--no-sandbox`): the
sandbox is corral's (namespaces, seccomp, Landlock, cgroup limits).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corral.errors import SandboxStartError
from corral.sandbox.spec import Limits, NetworkSpec, SandboxSpec

if TYPE_CHECKING:
    from corral.run.forward_helper import HelperForwarder
    from corral.sandbox.backend import Backend, Sandbox, SandboxNet
    from corral.sandbox.spec import ExecResult

__all__ = [
    "CHROMIUM",
    "ViewerLimits",
    "ViewerSandbox",
    "chromium_argv",
    "viewer_spec",
]

# Debian's browser binary itself: the /usr/bin/chromium launcher script adds
# `--enable-remote-extensions` and loads extensions from /etc/chromium.d, and
# it exits when /proc/cpuinfo is not what it expects.
CHROMIUM = "/usr/lib/chromium/chromium"
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
        "--remote-debugging-pipe",
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

    The sandbox's stdin and stdout become Chromium's DevTools pipe (fds 3
    and 4); its own stdio is /dev/null inside the sandbox: it is product-
    influenced text the host has no use for and must not store unbounded.
    """
    script = 'exec 3<&0 4>&1 </dev/null >/dev/null 2>&1; exec "$@"'
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
        forwarder: HelperForwarder,
        parent_cgroup: str | None,
    ) -> None:
        self._stops: list[Callable[[], None]] = []
        holder: list[SandboxNet] = []

        def hook(net: SandboxNet) -> None:
            holder.append(net)
            self._stops.append(forwarder.expose(net.listen(product_port), product, product_port))

        # Commands go host -> Chromium's fd 3 (the sandbox's stdin), answers
        # and events Chromium's fd 4 (its stdout) -> host.
        cmd_r, cmd_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        self._devtools: tuple[int, int] | None = (out_r, cmd_w)
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            self.sandbox: Sandbox = backend.start(
                spec, parent_cgroup=parent_cgroup, network=hook, stdio=(cmd_r, out_w, null)
            )
        except BaseException:
            self._close_devtools()
            raise
        finally:
            # The sandbox holds its ends now; ours would keep the pipe open
            # after Chromium died (no EOF on out_r).
            for fd in (cmd_r, out_w, null):
                os.close(fd)
        self.net: SandboxNet = holder[0]

    def take_devtools(self) -> tuple[int, int]:
        """Chromium's DevTools pipe (read fd, write fd); the caller owns them from now on."""
        if self._devtools is None:
            raise SandboxStartError("the viewer's DevTools pipe was already taken")
        fds, self._devtools = self._devtools, None
        return fds

    def _close_devtools(self) -> None:
        fds, self._devtools = self._devtools, None
        for fd in fds or ():
            os.close(fd)

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
        self._close_devtools()
        return result
