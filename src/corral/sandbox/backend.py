"""The sandbox backend interface: what callers may use, whatever the isolation.

Callers (`corral exec`, `corral run`, `corral verify`, doctor) depend on these
Protocols only, never on a backend's classes, processes or host pids:

- a `Backend` checks which protection layers this host offers for a spec,
  starts a spec, and previews how it would start it (`--dry-run`);
- a started `Sandbox` is waited for, interrupted, killed, measured, frozen
  and thawed, then closed; its `layers` say what was active;
- a `SandboxNet` is the sandbox's own loopback seen from the host: the broker
  listens there, port forwards connect there. A namespace sandbox implements
  it with its network namespace, a gVisor sandbox with its netns or a socket,
  a microVM with a virtio-serial or vsock channel; no caller enters a
  namespace itself.

Backends are chosen by a tagged, frozen config (`BackendConfig`), whose
`load()` imports the implementation only when it is used, so `corral exec`
with the default backend imports nothing it does not run.

The contract every backend keeps is written once, as a suite, in
`tests/conformance/` (run against each real backend and the fake in
`tests/fakes/`); `corral verify --backend X` points real attacks at it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from corral.sandbox.backend_config import (
    BACKEND_KINDS,
    BackendConfig,
    GVisorConfig,
    MicroVMConfig,
    NamespaceConfig,
    backend_config,
    load_backend,
)

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Mapping

    from corral.sandbox.cgroup import CgroupUsage
    from corral.sandbox.gvisor.connect import ExecDial
    from corral.sandbox.spec import ExecResult, SandboxSpec
    from corral.sandbox.unix_admit import UnixConnectEvent

__all__ = [
    "BACKEND_KINDS",
    "Backend",
    "BackendConfig",
    "ExecNet",
    "GVisorConfig",
    "MicroVMConfig",
    "NamespaceConfig",
    "NamespaceNet",
    "Sandbox",
    "SandboxNet",
    "backend_config",
    "load_backend",
]

# This module is for callers that type against the interface; `corral exec`'s
# start path does not import it (it costs `typing`): it uses `backend_config`.


class SandboxNet(Protocol):
    """The sandbox's own loopback, from the host side."""

    def listen(self, port: int) -> socket.socket:
        """A socket listening on the sandbox's 127.0.0.1:`port` (the host holds it)."""
        ...

    def connect(self, port: int) -> socket.socket:
        """A socket connected to the sandbox's 127.0.0.1:`port`."""
        ...


@runtime_checkable
class NamespaceNet(SandboxNet, Protocol):
    """A `SandboxNet` whose loopback is a network namespace any host process
    can enter (the namespace backend's). corral's forward helper connects to
    the product from there itself, so the sockets, and their kernel buffers,
    are the run cgroup's, not the coordinator's."""

    def namespace_fd(self) -> int:
        """The namespace's descriptor, still owned by the net (pass a copy on)."""
        ...


@runtime_checkable
class ExecNet(SandboxNet, Protocol):
    """A `SandboxNet` whose connect() starts a relay inside the sandbox with a
    host command (gVisor's `runsc exec`). corral's forward helper runs that
    command itself from `exec_dial()`, so the relay process, its socketpair
    and what drains it are the run cgroup's, not the coordinator's."""

    def exec_dial(self) -> ExecDial | None:
        """What any host process needs to connect as this net does (host-made,
        bounded); None when only this process can."""
        ...


class Sandbox(Protocol):
    """A started sandbox. `close()` last, always; it releases everything."""

    @property
    def layers(self) -> Mapping[str, object]:
        """The protection layers that are active (read-only)."""
        ...

    def poll(self) -> int | None:
        """None while the command runs; afterwards its exit status (not yet torn down)."""
        ...

    def wait(self, timeout_s: float | None = None) -> ExecResult:
        """Wait for the command (or the timeout), tear everything down, report."""
        ...

    def interrupt(self, signum: int) -> ExecResult:
        """Corral got `signum`: kill everything and report it."""
        ...

    def kill_all(self) -> None:
        """SIGKILL every process of the sandbox; idempotent."""
        ...

    def usage(self) -> CgroupUsage | None:
        """What the kernel counted so far (None when no counters are available)."""
        ...

    def freeze(self) -> None:
        """Stop every process of the sandbox where it is (memory kept)."""
        ...

    def thaw(self) -> None:
        """Undo `freeze()`."""
        ...

    def close(self) -> None:
        """Kill what is left, remove the sandbox's host resources, release descriptors."""
        ...


class Backend(Protocol):
    """One kind of isolation."""

    #: "namespace", "gvisor", "microvm", "fake"
    kind: str

    def check(self, spec: SandboxSpec) -> Mapping[str, str | None]:
        """Each layer the spec needs -> None when available, else why not."""
        ...

    def start(
        self,
        spec: SandboxSpec,
        *,
        parent_cgroup: str | None = None,
        network: Callable[[SandboxNet], None] | None = None,
        stdio: tuple[int | None, int | None, int | None] | None = None,
        unix_observer: Callable[[UnixConnectEvent], None] | None = None,
    ) -> Sandbox:
        """Start `spec`; `network` is called once the sandbox's loopback exists and
        before the command runs (the broker attaches there; the `SandboxNet`
        stays valid until `close()`). Raises LayerUnavailableError or
        SandboxStartError; never starts with less than the spec asks unless
        the spec names the degradation.

        `parent_cgroup`: the cgroup (relative path) the sandbox's own goes
        under (the run's, whose cap covers it). `stdio`: descriptors for the
        command's stdin, stdout, stderr (None: corral's own, with any
        terminal replaced by /dev/null). `unix_observer`: called for each
        connect() to a unix socket the backend admits or refuses, for the
        journal (backends without such a path never call it)."""
        ...

    def preview(self, spec: SandboxSpec) -> list[str]:
        """The command line(s) `start` would run, for `--dry-run`."""
        ...


# --- choosing a backend -------------------------------------------------------
# The configs live in `backend_config` (no `typing` import: `corral exec` loads
# them on its start path); they are re-exported here.
