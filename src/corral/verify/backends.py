"""The backends `corral verify` points its probes at.

- `namespace` (and `microvm`, `gvisor` when `corral exec` offers them): each
  probe runs as `python -m corral exec [--workspace WS] [--memory ..] [--pids ..]
  [--cpus ..] [--timeout ..] [--allow ..] [--journal F] [--config F] --json -- CMD`.
- `fastpath`: `namespace` through corral's fast path: the compiled front end
  (`exec/frontend.py`) talking to a resident launcher (`exec/launcher.py`)
  that the suite starts for itself (`CORRAL_LAUNCHER=require`, so a silent
  fallback to the Python CLI cannot pass for it).
- `none`: the same command straight on the host, in the workspace, with the
  caller's environment (planted secrets included) — the baseline on which
  every attack must succeed.
- `bwrap-basic`: a typical hand-written bubblewrap line as blog posts show it
  (see `BWRAP_BASIC`), run as the caller.
- `srt`: `srt -c CMD` from @anthropic-ai/sandbox-runtime with a settings file
  in the style of its README (`srt_settings`), installed with npm on demand.

Building a command line is pure; availability checks and the srt install are
the only I/O here.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from corral.verify.model import Fault, ProbeLimits

__all__ = [
    "BACKENDS",
    "BWRAP_BASIC",
    "Backend",
    "BwrapBasicBackend",
    "CorralBackend",
    "NoneBackend",
    "RunSpec",
    "SrtBackend",
    "make_backend",
    "parse_exec_report",
    "srt_settings",
    "with_fault",
]

BACKENDS: tuple[str, ...] = (
    "namespace",
    "none",
    "bwrap-basic",
    "srt",
    "microvm",
    "gvisor",
    "fastpath",
)

#: The hand-written line `bwrap-basic` stands for (WS is the workspace).
BWRAP_BASIC: tuple[str, ...] = (
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--bind",
    "WS",
    "WS",
    "--chdir",
    "WS",
    "--unshare-pid",
    "--die-with-parent",
)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What one probe run asks of the backend."""

    workspace: str
    limits: ProbeLimits
    allow: tuple[str, ...] = ()
    journal: str | None = None
    env_kind: str = "agent"
    settings_path: str = ""
    #: corral backends: `--config FILE` (a corral.toml outside the workspace).
    config_path: str | None = None
    #: corral backends: extra `corral exec` options.
    exec_args: tuple[str, ...] = ()


class Backend(ABC):
    """How to run a command "in" a backend, and what that backend can be judged on."""

    name: str
    kind: Literal["corral", "baseline", "peer"]
    #: Whether processes inside live in their own PID namespace (kill(-1) is safe).
    pidns: bool = True

    @abstractmethod
    def argv(self, cmd: list[str], run: RunSpec) -> list[str]:
        """The host command line for `cmd` (pure)."""

    def unavailable(self) -> str | None:
        """Why this backend cannot run here, or None."""
        return None

    def exec_env(self) -> dict[str, str]:
        """What the backend's own host process needs in its environment (not the probe's)."""
        return {}

    @contextmanager
    def session(self) -> Iterator[None]:
        """What the backend needs running while the suite runs (I/O)."""
        yield

    def report(self, stderr: str) -> tuple[dict[str, Any] | None, str]:
        """(end-of-task report, stderr without it); only corral produces one."""
        return None, stderr

    def not_applicable(self) -> dict[str, str]:
        """Requirements that make no sense for this backend, with the reason."""
        return {}

    #: The kernel that serves the sandbox's syscalls when it is not the host's
    #: (oracles.Reported); None: the host kernel.
    guest_kernel: str | None = None

    def not_applicable_probes(self) -> dict[str, str]:
        """Probes (by id) that make no sense for this backend, with the reason."""
        return {}

    def inside_count(self, owner: int) -> int | None:
        """How many processes run in the sandboxes host process `owner` started, by the
        backend's own listing; None: its processes are host processes (count the marker's)."""
        return None

    def host_tasks(self, owner: int) -> list[int] | None:
        """Host pids that execute the code of `owner`'s sandboxes when no host process
        carries the probe's marker; None: inspect the marker's processes."""
        return None

    #: A probe's deadline is multiplied by this (a VM under TCG boots for seconds).
    deadline_scale: float = 1.0
    #: The VMM's memory overhead (MiB) by accelerator that the backend adds to a
    #: VM's host cap on top of guest memory (`oracles.host_memory_bound`).
    vmm_overhead_mib: Mapping[str, int] = MappingProxyType({})
    #: How much slower the sandbox's code runs than the host's: a probe's
    #: wall-clock limit and the waits it measures against it (`P["slow"]`) are
    #: both multiplied by this, so their ratio (what the judge relies on) holds.
    time_scale: float = 1.0

    def needs_settings(self) -> bool:
        return False


def parse_exec_report(stderr: str) -> tuple[dict[str, Any] | None, str]:
    """Split `corral exec --json`'s final JSON object off its stderr."""
    lines = stderr.rstrip("\n").split("\n")
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "exit" in obj and "reason" in obj:
                rest = "\n".join(lines[:i] + lines[i + 1 :])
                return obj, rest
    return None, stderr


class CorralBackend(Backend):
    """`corral exec` with one of its backends."""

    kind = "corral"

    def __init__(self, name: str) -> None:
        self.name = name
        #: `fastpath`: the front end binary and the launcher's socket (`session()`).
        self.frontend: str | None = None
        self.launcher_socket: str | None = None
        if name == "microvm":
            # Without KVM the guest is emulated (TCG): Python in the guest takes
            # ~2 s to start on an idle host, and 4x was measured too little at
            # load 10-20 on 2 cores (probes killed before their first line).
            self.deadline_scale = 12.0
            self.time_scale = 12.0
            from corral.sandbox.microvm.vm import GUEST_KERNEL_MIB, VMM_OVERHEAD_MIB

            # The host cap over `--memory`: the guest kernel's share and QEMU's own.
            self.vmm_overhead_mib = MappingProxyType(
                {k: v + GUEST_KERNEL_MIB for k, v in VMM_OVERHEAD_MIB.items()}
            )
            self.guest_kernel = "the VM's own Linux kernel (QEMU microvm guest)"
        if name == "gvisor":
            self.guest_kernel = "gVisor's user-space kernel (the sentry)"
            # Every sandbox is a runsc boot (0.6-2.7 s here under load) and a
            # mission run boots several per session (agent, checks, product).
            self.deadline_scale = 3.0

    def argv(self, cmd: list[str], run: RunSpec) -> list[str]:
        if self.name == "fastpath":
            assert self.frontend is not None, "session() first"
            out = [self.frontend, "exec"]
        else:
            out = [sys.executable, "-m", "corral", "exec"]
        out += ["--workspace", run.workspace, "--env", run.env_kind, "--json"]
        if self.name not in ("namespace", "fastpath"):
            out += ["--backend", self.name]
        if self.name == "microvm":
            # Without hardware KVM the VM runs under TCG; the report's layers
            # (and the journal) say so.
            out += ["--allow-degraded", "kvm"]
        lim = run.limits
        if lim.memory is not None:
            out += ["--memory", lim.memory]
        if lim.pids is not None:
            out += ["--pids", str(lim.pids)]
        if lim.cpus is not None:
            out += ["--cpus", str(lim.cpus)]
        if lim.timeout_s is not None:
            out += ["--timeout", str(lim.timeout_s * self.time_scale)]
        for a in run.allow:
            out += ["--allow", a]
        if run.journal is not None:
            out += ["--journal", run.journal]
        if run.config_path is not None:
            out += ["--config", run.config_path]
        out += run.exec_args
        return [*out, "--", *cmd]

    def report(self, stderr: str) -> tuple[dict[str, Any] | None, str]:
        return parse_exec_report(stderr)

    def not_applicable(self) -> dict[str, str]:
        return {}

    def exec_env(self) -> dict[str, str]:
        if self.launcher_socket is None:
            return {}
        return {"CORRAL_LAUNCHER": "require", "CORRAL_LAUNCHER_SOCKET": self.launcher_socket}

    @contextmanager
    def session(self) -> Iterator[None]:
        """For `fastpath`: build the front end and run a launcher of the suite's own."""
        if self.name != "fastpath":
            yield
            return
        import signal
        import tempfile

        from corral.exec import launcher
        from corral.exec.frontend import frontend_binary
        from corral.sandbox.namespace import cache_dir

        self.frontend = frontend_binary(cache_dir())
        # Short: a unix socket's path holds 108 bytes.
        d = tempfile.mkdtemp(prefix="cv-", dir="/tmp")
        sock = os.path.join(d, "l.sock")
        proc = launcher.start_private(Path(sock), idle_s=3600.0)
        self.launcher_socket = sock
        try:
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(d, ignore_errors=True)

    def inside_count(self, owner: int) -> int | None:
        if self.name != "gvisor":
            return None
        from corral.sandbox.gvisor import ps

        counts = [ps.container_pids(s) for s in ps.find_sandboxes(owner)]
        return sum(len(c) for c in counts if c is not None)

    def host_tasks(self, owner: int) -> list[int] | None:
        if self.name != "gvisor":
            return None
        from corral.sandbox.gvisor import ps

        return [pid for s in ps.find_sandboxes(owner) for pid in ps.host_tasks(s)]

    def not_applicable_probes(self) -> dict[str, str]:
        if self.name not in ("gvisor", "microvm"):
            return {}
        why = (
            "the probe's processes live in gVisor's user-space kernel: no host process carries "
            "them, so there is no host /proc/<pid>/status to read; the host processes that run "
            "the sandbox are runsc's sentry, gofer and platform stubs"
        )
        if self.name == "microvm":
            why = (
                "the probe's processes live in the VM's guest kernel: no host process carries "
                "them, so there is no host /proc/<pid>/status to read; the host process that "
                "runs the sandbox is QEMU (its uid, seccomp filter and cgroup: "
                "tests/integration/sandbox/test_microvm.py)"
            )
        na = dict.fromkeys(
            (
                "priv-host-uid-root",
                "priv-capabilities",
                "priv-no-new-privs-unset",
                "priv-no-seccomp",
            ),
            why,
        )
        if self.name == "microvm":
            na.update(_MICROVM_NA_PROBES)
        return na


#: Probes that judge from the probe's host processes, which a VM has none of.
_MICROVM_NA_PROBES = {
    "cross-shared-uid": (
        "the guest's syscalls are served by its own kernel: its inotify instances, pipe "
        "pages, keyrings and process counts are per-guest, not the host uid's; the only host "
        "process of a VM is its QEMU (workspace owner's uid, own cgroup capped at VMM_PIDS "
        "tasks), so two VMs of one owner share that uid but guest code reaches no per-uid host "
        "quota through it, and the host has no process of the probe to inspect"
    ),
    "use-pids": (
        "the probe's processes live in the guest kernel, which the host cannot list; the "
        "guest's pids limit (its pids controller, forks refused counted in the exit report) is "
        "tested by tests/integration/sandbox/test_microvm.py::"
        "test_boot_exit_output_workspace_and_isolation"
    ),
}


class NoneBackend(Backend):
    """No sandbox: the baseline."""

    name = "none"
    kind = "baseline"
    pidns = False

    def argv(self, cmd: list[str], run: RunSpec) -> list[str]:
        # A shell stays the parent (no exec: the trailing `exit`), as a caller
        # would be: its /proc/<pid>/environ holds the caller's environment.
        return ["/bin/sh", "-c", '"$@"; exit $?', "corral-verify-none", *cmd]

    def not_applicable(self) -> dict[str, str]:
        return {
            "M12": "no sandbox: there is no separate verifier environment",
        }


class BwrapBasicBackend(Backend):
    """The typical hand-written bubblewrap line, run as the caller."""

    name = "bwrap-basic"
    kind = "peer"

    def unavailable(self) -> str | None:
        return None if shutil.which("bwrap") else "bwrap is not installed"

    def argv(self, cmd: list[str], run: RunSpec) -> list[str]:
        args = [run.workspace if a == "WS" else a for a in BWRAP_BASIC]
        return ["bwrap", *args, "--", *cmd]

    def not_applicable(self) -> dict[str, str]:
        return {
            "M11": "a bubblewrap line has no product viewer",
            "M12": "a bubblewrap line has no verifier environment",
            "U3": "a bubblewrap line has no broker (the host network is shared)",
            "U5": "a bubblewrap line has no MCP gateway",
            "U9": "a bubblewrap line has no product/verifier environments",
        }


def srt_settings(workspace: str, allow: tuple[str, ...]) -> dict[str, Any]:
    """The srt configuration for one run, after the README's "Restrict to
    specific directories" recipe: reads allowed except ~/.ssh, writes only to
    the workspace, network only to the run's allowlist."""
    return {
        "network": {"allowedDomains": list(allow), "deniedDomains": []},
        "filesystem": {"denyRead": ["~/.ssh"], "allowWrite": [workspace], "denyWrite": []},
    }


def _tools_dir() -> Path:
    import corral

    repo = Path(corral.__file__).resolve().parents[2]
    if (repo / "pyproject.toml").exists():
        return repo / "tools" / "srt"
    return Path.home() / ".cache" / "corral" / "tools" / "srt"


class SrtBackend(Backend):
    """`srt -c CMD` from @anthropic-ai/sandbox-runtime."""

    name = "srt"
    kind = "peer"

    def __init__(self) -> None:
        self.prefix = _tools_dir()
        self.path = str(self.prefix / "node_modules" / ".bin" / "srt")

    def install(self) -> str | None:
        """Install srt with npm when missing; returns why it is unavailable."""
        if os.path.exists(self.path):
            return None
        if shutil.which("srt"):
            self.path = shutil.which("srt") or self.path
            return None
        npm = shutil.which("npm")
        if npm is None:
            return "srt is not installed and npm is not available to install it"
        self.prefix.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(self.prefix),
                "@anthropic-ai/sandbox-runtime",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0 or not os.path.exists(self.path):
            return f"npm install @anthropic-ai/sandbox-runtime failed: {proc.stderr.strip()[-200:]}"
        return None

    def unavailable(self) -> str | None:
        why = self.install()
        if why:
            return why
        missing = [t for t in ("bwrap", "socat", "rg") if shutil.which(t) is None]
        if missing:
            return f"srt needs {', '.join(missing)} (apt-get install bubblewrap socat ripgrep)"
        return None

    def needs_settings(self) -> bool:
        return True

    def argv(self, cmd: list[str], run: RunSpec) -> list[str]:
        return [self.path, "--settings", run.settings_path, "-c", shlex.join(cmd)]

    def not_applicable(self) -> dict[str, str]:
        return {
            "M11": "srt has no product viewer",
            "M12": "srt has no verifier environment",
            "U5": "srt has no MCP gateway",
            "U9": "srt has no product/verifier environments",
        }


#: Remounts every cgroup mount read-only in a private mount namespace, then
#: runs "$@": corral's cgroup layer cannot be set up there (exit 99 when the
#: fault itself could not be injected).
_RO_CGROUPS = (
    "for m in $(awk '$3 ~ /^cgroup2?$/ {print $2}' /proc/mounts); do "
    'mount -o remount,bind,ro "$m" || exit 99; done; exec "$@"'
)


def with_fault(fault: Fault | None, argv: list[str]) -> list[str]:
    """`argv` wrapped so that it runs under the injected fault (pure)."""
    match fault:
        case None:
            return argv
        case "ro-cgroups":
            return [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "/bin/sh",
                "-c",
                _RO_CGROUPS,
                "sh",
                *argv,
            ]


def make_backend(name: str) -> Backend:
    if name in ("namespace", "microvm", "gvisor", "fastpath"):
        return CorralBackend(name)
    if name == "none":
        return NoneBackend()
    if name == "bwrap-basic":
        return BwrapBasicBackend()
    if name == "srt":
        return SrtBackend()
    raise ValueError(f"unknown backend {name!r} (one of {', '.join(BACKENDS)})")
