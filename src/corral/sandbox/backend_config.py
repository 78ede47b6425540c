"""Choosing a backend: a tagged union of frozen configs with a lazy import.

`backend_config(kind)` names one (`--backend`, a mission's `backend = "..."`);
its `load()` imports the implementation only when it is used, and
`load_backend()` turns a backend that this build or host lacks into a clean
refusal. Constructors of backends take their config object. No `typing`
import here: `corral exec` loads this module on its start path.
"""

from __future__ import annotations

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


class _Frozen:
    """Frozen value semantics over `__slots__`, without `dataclasses` (about 1 ms
    per class at import, on `corral exec`'s start path)."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, values: tuple[object, ...]) -> None:
        """`values` in `__slots__` order."""
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        args = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({args})"


class NamespaceConfig(_Frozen):
    """bubblewrap + cgroups + seccomp + Landlock + the compiled init (the default)."""

    __slots__ = ("init_kind", "kind")
    kind: Literal["namespace"]
    #: the in-sandbox init: compiled from init.c ("c"), init.py ("python"), or "auto"
    init_kind: Literal["auto", "c", "python"]

    def __init__(self, init_kind: Literal["auto", "c", "python"] = "auto") -> None:
        super().__init__((init_kind, "namespace"))

    def load(self) -> Backend:
        from corral.sandbox.namespace import NamespaceBackend

        return NamespaceBackend(self)


class GVisorConfig(_Frozen):
    """runsc (gVisor): a user-space kernel between the sandbox and the host."""

    __slots__ = ("kind", "platform", "runsc")
    kind: Literal["gvisor"]
    #: the runsc binary; None: found on PATH
    runsc: str | None
    #: ptrace, systrap or kvm; None: the best one `check()` finds on this host
    platform: str | None

    def __init__(self, runsc: str | None = None, platform: str | None = None) -> None:
        super().__init__(("gvisor", platform, runsc))

    def load(self) -> Backend:
        from corral.sandbox.gvisor import GVisorBackend

        return GVisorBackend(self)


class MicroVMConfig(_Frozen):
    """QEMU `-M microvm` with a Debian kernel and a minimal root filesystem."""

    __slots__ = ("accel", "kind", "qemu")
    kind: Literal["microvm"]
    #: the qemu-system-x86_64 binary; None: found on PATH
    qemu: str | None
    #: "auto": hardware KVM where the CPU has vmx/svm, else TCG (needs `--allow-degraded kvm`)
    accel: Literal["auto", "kvm", "tcg"]

    def __init__(
        self, qemu: str | None = None, accel: Literal["auto", "kvm", "tcg"] = "auto"
    ) -> None:
        super().__init__((accel, "microvm", qemu))

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
