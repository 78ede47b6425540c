"""Choosing a backend: a tagged union of frozen configs with a lazy import.

`backend_config(kind)` names one (`--backend`, a mission's `backend = "..."`);
its `load()` imports the implementation only when it is used, and
`load_backend()` turns a backend that this build or host lacks into a clean
refusal. Constructors of backends take their config object. No `typing`
import here: `corral exec` loads this module on its start path.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.errors import ConfigError, LayerUnavailableError

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    from corral.sandbox.backend import Backend

__all__ = [
    "BACKEND_KINDS",
    "BackendConfig",
    "GVisorConfig",
    "MicroVMConfig",
    "NamespaceConfig",
    "backend_config",
    "load_backend",
]


@dataclass(frozen=True, slots=True)
class NamespaceConfig:
    """bubblewrap + cgroups + seccomp + Landlock + the compiled init (the default)."""

    kind: Literal["namespace"] = "namespace"
    #: the in-sandbox init: compiled from init.c ("c"), init.py ("python"), or "auto"
    init_kind: Literal["auto", "c", "python"] = "auto"

    def load(self) -> Backend:
        from corral.sandbox.namespace import NamespaceBackend

        return NamespaceBackend(self)


@dataclass(frozen=True, slots=True)
class GVisorConfig:
    """runsc (gVisor): a user-space kernel between the sandbox and the host."""

    kind: Literal["gvisor"] = "gvisor"
    #: the runsc binary; None: found on PATH
    runsc: str | None = None
    #: ptrace, systrap or kvm; None: the best one `check()` finds on this host
    platform: str | None = None

    def load(self) -> Backend:
        from corral.sandbox.gvisor import GVisorBackend

        return GVisorBackend(self)


@dataclass(frozen=True, slots=True)
class MicroVMConfig:
    """QEMU `-M microvm` with a Debian kernel and a minimal root filesystem."""

    kind: Literal["microvm"] = "microvm"
    #: the qemu-system-x86_64 binary; None: found on PATH
    qemu: str | None = None
    #: "auto": hardware KVM where the CPU has vmx/svm, else TCG (needs `--allow-degraded kvm`)
    accel: Literal["auto", "kvm", "tcg"] = "auto"

    def load(self) -> Backend:
        from corral.sandbox.microvm import MicroVMBackend

        return MicroVMBackend(self)


BackendConfig = NamespaceConfig | GVisorConfig | MicroVMConfig

BACKEND_KINDS: tuple[str, ...] = ("namespace", "gvisor", "microvm")


def backend_config(kind: str) -> BackendConfig:
    """The default config of the backend named `kind`; ConfigError for any other name."""
    if kind == "namespace":
        return NamespaceConfig()
    if kind == "gvisor":
        return GVisorConfig()
    if kind == "microvm":
        return MicroVMConfig()
    raise ConfigError(f"unknown backend {kind!r}; one of {', '.join(BACKEND_KINDS)}")


def load_backend(config: BackendConfig) -> Backend:
    """The backend `config` names; LayerUnavailableError (the backend as the
    layer) when its implementation is not part of this build."""
    try:
        return config.load()
    except ImportError as exc:
        raise LayerUnavailableError(
            config.kind,
            f"the {config.kind} backend is not available in this build ({exc.name or exc})",
            "use --backend namespace",
        ) from exc
