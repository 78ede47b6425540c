"""What a sandbox is asked to be: pure, frozen data shared by every backend.

A `SandboxSpec` says what the sandboxed command sees and may use; a backend
turns it into processes and reports how they ended as an `ExecResult`.
Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_PATH",
    "EXIT_REASONS",
    "LAYERS",
    "SANDBOX_PROXY_PORT",
    "Bind",
    "ExecResult",
    "Limits",
    "NetworkSpec",
    "SandboxSpec",
]

# Not `typing.TYPE_CHECKING`: importing typing costs ~5 ms on every `corral exec`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    EnvKind = Literal["exec", "agent", "product", "verifier"]
    ExitReason = Literal["exited", "killed", "timeout", "oom", "refused"]

#: Protection layers a user may explicitly run without (`--allow-degraded`).
#: bubblewrap, user namespaces and the init are not among them: without
#: them there is no sandbox at all. `kvm` is the microvm backend's hardware
#: acceleration: without it the VM runs under QEMU's TCG emulation.
LAYERS: tuple[str, ...] = ("cgroup", "seccomp", "landlock", "unix", "kvm")

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class Bind:
    """A host path made visible inside the sandbox at the same path."""

    path: str
    writable: bool


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits; None means unlimited (only the run-wide cap applies)."""

    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None
    timeout_s: float | None = None
    #: Size of each writable tmpfs scratch area (/tmp, /var/tmp, home, /dev/shm).
    disk_bytes: int | None = None


#: The broker's port on a sandbox's own loopback (every backend forwards it).
SANDBOX_PROXY_PORT = 3128


@dataclass(frozen=True, slots=True)
class NetworkSpec:
    """Egress: nothing at all unless a broker configuration is given.

    `broker_config` is a BrokerConfig JSON document (allow rules, routes);
    kept as text so this module stays free of pydantic. `allow` records the
    `--allow` flags it was built from, for reports.
    """

    allow: tuple[str, ...] = ()
    broker_config: str | None = None
    #: A host file (host bundle + the run's interception CA) shown read-only at
    #: /etc/ssl/certs/ca-certificates.crt; see broker/tls_setup.py.
    trust_bundle: str | None = None
    #: The sandbox's /etc/ssh/ssh_config (read-only): ssh's ProxyCommand through
    #: the broker when there are `[[tcp]]` rules; see broker/tcp.py.
    ssh_config: str | None = None

    @property
    def needs_broker(self) -> bool:
        return self.broker_config is not None


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """A command and the world it runs in.

    `workspace` is the only host path writable by default (at the same path);
    `binds` adds `--ro`/`--rw` paths. `env` is the complete environment of
    the command (an allowlist built by the caller; never the caller's own).
    """

    argv: tuple[str, ...]
    workspace: str
    env: tuple[tuple[str, str], ...]
    binds: tuple[Bind, ...] = ()
    limits: Limits = field(default_factory=Limits)
    network: NetworkSpec = field(default_factory=NetworkSpec)
    env_kind: EnvKind = "exec"
    home: str = "/home/corral"
    hostname: str = "corral"
    allow_degraded: frozenset[str] = frozenset()
    run_id: str | None = None
    session_id: str | None = None
    #: Make host-executed workspace files read-only (`sandbox/protect.py`),
    #: except the names in `unprotect`.
    protect: bool = False
    unprotect: frozenset[str] = frozenset()
    #: `--allow-unix`: host unix sockets (inside a mounted tree) the sandbox may connect to.
    allow_unix: tuple[str, ...] = ()


#: How a sandbox can end (`ExecResult.reason`): the command exited by itself;
#: it (or the sandbox) was killed by a signal; the wall-clock limit; the
#: memory limit's OOM killer; the sandbox refused or failed to run it (125).
EXIT_REASONS: tuple[str, ...] = ("exited", "killed", "timeout", "oom", "refused")


@dataclass(frozen=True, slots=True)
class ExecResult:
    """How a sandboxed command ended and what it used (`docs/design.md` section 5).

    Every backend reports this; the numbers come from the host's side of the
    boundary (the backend's monitor and the kernel's counters), never from
    the sandbox. `exit` follows the shell's conventions: n, 124 timeout,
    128+signal killed (137 also for "oom"), 125 refused.
    """

    exit: int
    reason: ExitReason
    wall_s: float
    cpu_s: float
    peak_memory_bytes: int
    processes_killed_at_end: int
    layers: dict[str, object]
    oom_kills: int = 0
    pids_limit_hits: int = 0
    message: str = ""
    events: tuple[dict[str, object], ...] = ()
    #: /proc comm of (at most 16 of) the processes killed at the end: the sandbox's text.
    killed_names: tuple[str, ...] = ()

    def summary(self, observations: dict[str, int] | None = None) -> dict[str, object]:
        return {
            "exit": self.exit,
            "reason": self.reason,
            "wall_s": round(self.wall_s, 4),
            "cpu_s": round(self.cpu_s, 4),
            "peak_memory_bytes": self.peak_memory_bytes,
            "processes_killed_at_end": self.processes_killed_at_end,
            "observations": observations or {"allowed": 0, "denied": 0},
            "layers": dict(self.layers),
            "oom_kills": self.oom_kills,
            "pids_limit_hits": self.pids_limit_hits,
        }
