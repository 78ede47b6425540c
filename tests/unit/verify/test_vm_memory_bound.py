"""M7 memory oracle for a VM: the host peak against guest + declared VMM overhead (pure).

The figures are the 2026-12 TCG run's `res-memory-hog` (guest 256 MiB, host
cap 512 MiB, VM peak 348 MiB): within the VM's cap, but above `--memory`,
which is what a namespace sandbox is held to.
"""

from __future__ import annotations

from typing import Any

from corral.verify.model import Evidence
from corral.verify.oracles import MemoryAbove

MIB = 1 << 20
LIMIT = 256 * MIB
TCG = {"kvm": 64, "tcg": 256}


def _ev(
    peak_mib: int, cap_mib: int | None, overhead: dict[str, int], accel: str = "tcg"
) -> Evidence:
    layers: dict[str, Any] = {"backend": "microvm", "accel": accel}
    if cap_mib is not None:
        layers["memory_cap_bytes"] = cap_mib * MIB
    report = {"exit": 137, "reason": "oom", "peak_memory_bytes": peak_mib * MIB, "layers": layers}
    return Evidence(backend_report=report, vmm_overhead_mib=overhead)


def test_vm_peak_within_guest_plus_declared_overhead_is_denied() -> None:
    j = MemoryAbove(LIMIT).judge(_ev(348, 512, TCG))
    assert j.observed == "denied", j.why
    assert "VM cap 512 MiB (256 + guest kernel and VMM 256)" in j.why


def test_vm_peak_above_its_cap_is_allowed() -> None:
    assert MemoryAbove(LIMIT).judge(_ev(640, 512, TCG)).observed == "allowed"


def test_not_loosened_for_a_backend_without_a_declared_vmm() -> None:
    # The same report, but the backend declares no VMM: the limit is the bound.
    j = MemoryAbove(LIMIT).judge(_ev(348, 512, {}))
    assert j.observed == "allowed" and "limit 256 MiB" in j.why


def test_a_guest_given_more_than_memory_is_held_to_the_limit() -> None:
    # A cap of 768 MiB under TCG means a 512 MiB guest for `--memory 256M`.
    assert MemoryAbove(LIMIT).judge(_ev(348, 768, TCG)).observed == "allowed"
    # A KVM VM's overhead is 64 MiB: a TCG-sized cap under kvm is not declared.
    assert MemoryAbove(LIMIT).judge(_ev(348, 512, TCG, accel="kvm")).observed == "allowed"
    assert MemoryAbove(LIMIT).judge(_ev(348, None, TCG)).observed == "allowed"


def test_only_the_microvm_backend_declares_a_vmm_overhead() -> None:
    from corral.sandbox.microvm.vm import GUEST_KERNEL_MIB, VMM_OVERHEAD_MIB
    from corral.verify.backends import CorralBackend

    declared = dict(CorralBackend("microvm").vmm_overhead_mib)
    assert declared == {k: v + GUEST_KERNEL_MIB for k, v in VMM_OVERHEAD_MIB.items()}
    for name in ("namespace", "gvisor", "bwrap-basic"):
        assert not CorralBackend(name).vmm_overhead_mib


def test_microvm_declares_host_process_probes_not_applicable_with_a_reason() -> None:
    from corral.verify.backends import CorralBackend

    na = CorralBackend("microvm").not_applicable_probes()
    assert "guest kernel" in na["use-pids"] and "QEMU" in na["cross-shared-uid"]
    assert "use-pids" not in CorralBackend("namespace").not_applicable_probes()
