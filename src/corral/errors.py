"""The one exception tree of corral.

CorralError
├── UsageError(CorralError, ValueError)        bad input from the user -> exit 2
├── ConfigError(CorralError, ValueError)       corral.toml / mission file rejected
├── LayerUnavailableError(CorralError, RuntimeError)
│                                              a protection layer is missing -> exit 125
├── SandboxStartError(CorralError, OSError)    the sandbox could not be started -> exit 125
├── CgroupError(CorralError, OSError)          cgroup create/limit/kill failed
├── BrokerError(CorralError, OSError)          the broker failed or is unreachable
├── JournalError(CorralError, OSError)         the journal cannot be written/read
├── PolicyError(CorralError, ValueError)       a policy is malformed (always denies)
├── ProviderError(CorralError, RuntimeError)   synthetic provider / scenario failures
├── AgentError(CorralError, RuntimeError)      an agent CLI adapter failed
├── RunDiskError(CorralError, OSError)         a run's quota'd disk image failed
├── HelperError(CorralError, RuntimeError)     a run's helper could not join, died, misspoke
└── StoreError(CorralError, OSError)           the shared run store failed
    └── LeaseLostError(StoreError)             this worker no longer holds the run's lease

Defined next to the code that raises and catches them (`corral.viewer`):
CdpError(CorralError, ConnectionError) the viewer's DevTools connection failed;
InputRejected(CorralError, ValueError) a viewer page message refused;
FrameRejected(CorralError, ValueError) browser data that is not a bounded JPEG.
And by `corral exec`'s launcher (`corral.exec.launcher`, `corral.exec.frontend`):
LaunchRequestError(CorralError, ValueError) a launcher request refused (malformed, too large);
FrontendBuildError(CorralError, OSError) the compiled front end could not be built or installed.
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "BrokerError",
    "CgroupError",
    "ConfigError",
    "CorralError",
    "HelperError",
    "JournalError",
    "LayerUnavailableError",
    "LeaseLostError",
    "PolicyError",
    "ProviderError",
    "RunDiskError",
    "SandboxStartError",
    "StoreError",
    "UsageError",
]


class CorralError(Exception):
    """Root of every error corral raises on purpose."""


class UsageError(CorralError, ValueError):
    """The user's input is invalid; the CLI prints one line and exits 2."""


class ConfigError(CorralError, ValueError):
    """A configuration or mission file was rejected."""


class LayerUnavailableError(CorralError, RuntimeError):
    """A protection layer the profile needs is not available on this host."""

    def __init__(
        self, layer: str, reason: str, hint: str = "", *, degradable: bool = False
    ) -> None:
        self.layer = layer
        self.reason = reason
        self.hint = hint
        msg = f"protection layer '{layer}' unavailable: {reason}"
        extra = [hint] if hint else []
        if degradable:
            extra.append(f"or pass --allow-degraded {layer}")
        if extra:
            msg += f" (hint: {'; '.join(extra)})"
        super().__init__(msg)


class SandboxStartError(CorralError, OSError):
    """The sandbox could not be started."""


class CgroupError(CorralError, OSError):
    """A cgroup operation failed."""


class BrokerError(CorralError, OSError):
    """The broker failed or is unreachable."""


class JournalError(CorralError, OSError):
    """The journal could not be written or read."""


class PolicyError(CorralError, ValueError):
    """A policy is malformed; actions it would decide are denied."""


class ProviderError(CorralError, RuntimeError):
    """The synthetic provider or a scenario failed."""


class AgentError(CorralError, RuntimeError):
    """An agent CLI adapter failed."""


class RunDiskError(CorralError, OSError):
    """A run's disk image could not be made, mounted or unmounted."""


class StoreError(CorralError, OSError):
    """The shared run store (PostgreSQL) cannot be reached, migrated or written."""


class LeaseLostError(StoreError):
    """This worker's lease on a run expired or was taken: it must not write or act."""


class HelperError(CorralError, RuntimeError):
    """A run's helper process (provider, report) could not join the run cgroup, died or misspoke."""
