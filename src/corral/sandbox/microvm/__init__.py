"""The microVM backend (QEMU `-M microvm`): see `vm.py` for what the host trusts."""

from __future__ import annotations

from corral.sandbox.microvm.vm import MicroVMBackend, MicroVMSandbox

__all__ = ["MicroVMBackend", "MicroVMSandbox"]
