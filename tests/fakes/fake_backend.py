"""A `Backend` that isolates nothing: for coordinator unit tests and the conformance suite.

`FakeBackend` keeps the interface's contract without any protection layer:
it records every spec it is asked to start, and either

- finishes at once with an `ExecResult` queued by `script()` (a coordinator
  unit test decides how each sandbox "ends" without running anything), or
- runs the spec's argv as a plain host subprocess in its own process group
  (cwd the workspace, env exactly the spec's), so the contract tests in
  `tests/conformance/` run against it as they do against a real backend.

Its `SandboxNet` is the host's loopback: `listen(port)` binds the host's
127.0.0.1:port, which is where a host subprocess connects. Never use it for
anything untrusted: the command can reach all of the host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from corral.sandbox.cgroup import CgroupUsage
from corral.sandbox.netns import listen_on
from corral.sandbox.spec import ExecResult, SandboxSpec
from corral.sandbox.unix_admit import UnixConnectEvent

__all__ = ["FakeBackend", "FakeNet", "FakeSandbox"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


class FakeNet:
    """The host's own loopback, standing in for a sandbox's."""

    def __init__(self) -> None:
        self.listened: list[int] = []
        self.connected: list[int] = []

    def listen(self, port: int) -> socket.socket:
        sock = listen_on(socket.socket(socket.AF_INET, socket.SOCK_STREAM), port)
        self.listened.append(port)
        return sock

    def connect(self, port: int) -> socket.socket:
        self.connected.append(port)
        return socket.create_connection(("127.0.0.1", port), timeout=10.0)


def _group_pids(pgid: int) -> set[int]:
    out: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, [2] the process group; zombies are not left running.
        if int(fields[2]) == pgid and fields[0] != b"Z":
            out.add(int(name))
    return out


def _state(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b""


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime (fields 14-17 of proc(5), 12-15 here).
    return sum(int(f) for f in fields[11:15]) / _CLK_TCK


class FakeSandbox:
    """A started fake: a host process group, or a scripted result."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        proc: subprocess.Popen[bytes] | None,
        scripted: ExecResult | None,
        nets: list[FakeNet],
    ) -> None:
        self.spec = spec
        self._proc = proc
        self._scripted = scripted
        self._nets = nets
        self._layers: dict[str, object] = {"fake": True}
        self._started = time.monotonic()
        self._cpu = 0.0
        self._leftovers = 0
        self.closed = 0
        self.frozen = False

    @property
    def layers(self) -> Mapping[str, object]:
        return MappingProxyType(self._layers)

    def poll(self) -> int | None:
        if self._proc is None:
            assert self._scripted is not None
            return self._scripted.exit
        rc = self._proc.poll()
        if rc is not None:
            self._count_leftovers()
        return rc

    def _count_leftovers(self) -> None:
        if self._proc is not None:
            self._leftovers = max(self._leftovers, len(_group_pids(self._proc.pid)))

    def _result(self, exit: int, reason: str) -> ExecResult:
        if self._scripted is not None:
            return self._scripted
        return ExecResult(
            exit=exit,
            reason=reason,  # type: ignore[arg-type]
            wall_s=time.monotonic() - self._started,
            cpu_s=self._cpu,
            peak_memory_bytes=0,
            processes_killed_at_end=self._leftovers,
            layers=dict(self._layers),
        )

    def _end(self) -> None:
        assert self._proc is not None
        self._count_leftovers()
        self.kill_all()
        self._proc.wait()

    def wait(self, timeout_s: float | None = None) -> ExecResult:
        if self._proc is None:
            return self._result(0, "exited")
        if self._proc.returncode is None:
            pidfd = os.pidfd_open(self._proc.pid)
            try:
                ready, _, _ = select.select([pidfd], [], [], timeout_s)
            finally:
                os.close(pidfd)
            if not ready:
                self._end()
                return self._result(124, "timeout")
        # Exited but not reaped yet: its CPU time is still in /proc.
        self._end()
        rc = self._proc.returncode
        assert rc is not None
        if rc < 0:
            return self._result(128 - rc, "killed")
        return self._result(rc, "exited")

    def interrupt(self, signum: int) -> ExecResult:
        if self._proc is None:
            return self._result(128 + signum, "killed")
        self._end()
        return self._result(128 + signum, "killed")

    def kill_all(self) -> None:
        if self._proc is None:
            return
        self._cpu = max(self._cpu, _cpu_s(self._proc.pid))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()

    def usage(self) -> CgroupUsage | None:
        if self._proc is None:
            return None
        self._cpu = max(self._cpu, _cpu_s(self._proc.pid))
        return CgroupUsage(0, self._cpu, 0, 0, 0)

    def _signal_group(self, signum: int) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signum)

    def freeze(self) -> None:
        self._signal_group(signal.SIGSTOP)
        # SIGSTOP takes effect when each task is next scheduled: wait until
        # every process of the group shows as stopped.
        if self._proc is not None:
            deadline = time.monotonic() + 10.0
            while not all(_state(p) in (b"T", b"Z", b"") for p in _group_pids(self._proc.pid)):
                if time.monotonic() > deadline:
                    raise TimeoutError("the fake's processes did not stop")
                time.sleep(0.001)
        self.frozen = True

    def thaw(self) -> None:
        self._signal_group(signal.SIGCONT)
        self.frozen = False

    def close(self) -> None:
        self.closed += 1
        if self.closed > 1:
            return
        if self._proc is not None and self._proc.poll() is None:
            self._end()
        elif self._proc is not None:
            self._signal_group(signal.SIGKILL)


class FakeBackend:
    """Records specs; runs them as host processes or ends them as scripted."""

    kind = "fake"

    def __init__(self, unavailable: Mapping[str, str] | None = None) -> None:
        #: layer -> why not, as `check()` reports it (default: nothing missing).
        self.unavailable = dict(unavailable or {})
        self.specs: list[SandboxSpec] = []
        self.started: list[FakeSandbox] = []
        self.parent_cgroups: list[str | None] = []
        self._script: list[ExecResult] = []

    def script(self, *results: ExecResult) -> None:
        """The next starts end at once with these results, in order."""
        self._script += results

    @staticmethod
    def result(exit: int = 0, reason: str = "exited", **fields: object) -> ExecResult:
        """An ExecResult for `script()`, zero usage unless given."""
        base = ExecResult(
            exit=exit,
            reason=reason,  # type: ignore[arg-type]
            wall_s=0.01,
            cpu_s=0.0,
            peak_memory_bytes=0,
            processes_killed_at_end=0,
            layers={"fake": True},
        )
        return dataclasses.replace(base, **fields)  # type: ignore[arg-type]

    def check(self, spec: SandboxSpec) -> dict[str, str | None]:
        return {"fake": None, **self.unavailable}

    def start(
        self,
        spec: SandboxSpec,
        *,
        parent_cgroup: str | None = None,
        network: Callable[[FakeNet], None] | None = None,
        stdio: tuple[int | None, int | None, int | None] | None = None,
        unix_observer: Callable[[UnixConnectEvent], None] | None = None,
    ) -> FakeSandbox:
        from corral.errors import LayerUnavailableError

        self.specs.append(spec)
        self.parent_cgroups.append(parent_cgroup)
        for layer, why in self.unavailable.items():
            if layer not in spec.allow_degraded:
                raise LayerUnavailableError(layer, why, degradable=True)
        nets: list[FakeNet] = []
        if network is not None:
            net = FakeNet()
            nets.append(net)
            network(net)
        if self._script:
            sandbox = FakeSandbox(spec, proc=None, scripted=self._script.pop(0), nets=nets)
        else:
            stdin, stdout, stderr = stdio if stdio is not None else (None, None, None)
            try:
                proc = subprocess.Popen(
                    list(spec.argv),
                    cwd=spec.workspace,
                    env=dict(spec.env),
                    stdin=stdin if stdin is not None else subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    start_new_session=True,
                )
            except FileNotFoundError:
                # What a shell (and every real backend's init) reports.
                missing = self.result(127, "exited", message="command not found")
                sandbox = FakeSandbox(spec, proc=None, scripted=missing, nets=nets)
            else:
                sandbox = FakeSandbox(spec, proc=proc, scripted=None, nets=nets)
        self.started.append(sandbox)
        return sandbox

    def preview(self, spec: SandboxSpec) -> list[str]:
        return ["fake", *spec.argv]
