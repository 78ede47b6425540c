"""The microVM backend as the conformance suite runs it: TCG accepted, boot awaited.

This host's KVM cannot run the guest, so every spec names the `kvm`
degradation explicitly (as `--allow-degraded kvm` does). `start()` returns
once the guest init has started the command: a TCG boot takes seconds,
and the suite's waits bound the command's behaviour, not the boot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from corral.sandbox.backend import MicroVMConfig, SandboxNet
from corral.sandbox.microvm.vm import MicroVMBackend, MicroVMSandbox
from corral.sandbox.spec import SandboxSpec
from corral.sandbox.unix_admit import UnixConnectEvent


def _tcg(spec: SandboxSpec) -> SandboxSpec:
    return dataclasses.replace(spec, allow_degraded=spec.allow_degraded | {"kvm"})


class TcgMicroVM:
    kind = "microvm"

    def __init__(self) -> None:
        backend = MicroVMConfig().load()
        assert isinstance(backend, MicroVMBackend)
        self._backend = backend

    def check(self, spec: SandboxSpec) -> Mapping[str, str | None]:
        return self._backend.check(_tcg(spec))

    def preview(self, spec: SandboxSpec) -> list[str]:
        return self._backend.preview(_tcg(spec))

    def start(
        self,
        spec: SandboxSpec,
        *,
        parent_cgroup: str | None = None,
        network: Callable[[SandboxNet], None] | None = None,
        stdio: tuple[int | None, int | None, int | None] | None = None,
        unix_observer: Callable[[UnixConnectEvent], None] | None = None,
    ) -> MicroVMSandbox:
        sandbox = self._backend.start(
            _tcg(spec), parent_cgroup=parent_cgroup, network=network, stdio=stdio
        )
        sandbox.wait_started()
        return sandbox
