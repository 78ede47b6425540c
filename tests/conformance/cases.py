"""The backends the conformance suite runs against: one line each.

A backend joins the suite by adding one `Case` to `CASES` (its marker skips
it where the host lacks it; `CORRAL_REQUIRE_ALL=1` turns that skip into a
failure). `isolates=False` (the fake) runs the contract tests only, never
the guarantee tests; `not_applicable` names contract tests a backend cannot
keep, with the reason the skip shows.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest

from corral.sandbox.backend import Backend, GVisorConfig, NamespaceConfig
from tests.fakes.fake_backend import FakeBackend


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], Backend]
    marks: tuple[pytest.MarkDecorator, ...] = ()
    isolates: bool = True
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    #: Contract points a backend is known to break today (`test` or `test[param]` ->
    #: why): strict xfail, so the day one starts passing the suite says so.
    known_failures: Mapping[str, str] = field(default_factory=dict)
    #: Host-side cgroups an owner pid left behind (backends with their own cgroups).
    leftover_cgroups: Callable[[int], list[str]] = lambda _pid: []


def _namespace_cgroups(owner: int) -> list[str]:
    from corral.sandbox.cgroup import detect_layout

    layout = detect_layout()
    if layout is None:
        return []
    roots = [m for _, m in layout.v1] + ([layout.unified] if layout.unified else [])
    out: list[str] = []
    for root in roots:
        base = os.path.join(root, "corral")
        if os.path.isdir(base):
            out += [os.path.join(base, n) for n in os.listdir(base) if f"-{owner}-" in n]
    return out


_FAKE_NA = {
    "oom": "the fake has no memory limit (no cgroup)",
    "owner_killed": "the fake's host processes do not die with their owner",
}

_GVISOR_NA = {
    "close_idempotent": "the command's processes live in gVisor's own kernel: no host process "
    "carries its command line to look for (teardown: tests/integration/sandbox/test_gvisor.py)",
}
_GVISOR_KNOWN: dict[str, str] = {}


def _microvm() -> Backend:
    from tests.conformance.microvm import TcgMicroVM

    return TcgMicroVM()


def _microvm_na() -> dict[str, str]:
    from corral.sandbox.microvm.vm import kvm_status

    na = {
        "close_idempotent": "the command's processes live in the guest's kernel: no host process "
        "carries its command line (QEMU's teardown: tests/integration/sandbox/test_microvm.py)",
        "owner_killed": "the command's processes live in the guest's kernel: no host process "
        "carries its command line (tests/integration/sandbox/test_microvm.py::"
        "test_kill_9_of_the_owner_leaves_no_qemu)",
        "oom": "the guest kernel kills the command (reason oom from the init's report); "
        "`oom_kills` counts the host's kills of QEMU, which its cap prevents "
        "(tests/integration/sandbox/test_microvm.py::"
        "test_guest_memory_exhaustion_is_oom_and_the_host_cap_holds)",
    }
    with open("/proc/cpuinfo") as fh:
        why = kvm_status(fh.read(), os.path.exists("/dev/kvm"))
    if why is not None:
        na["check_and_preview"] = f"this host has no usable KVM ({why}): `kvm` is degraded"
    return na


CASES: tuple[Case, ...] = (
    Case(
        "namespace",
        NamespaceConfig().load,
        marks=(pytest.mark.requires_sandbox,),
        leftover_cgroups=_namespace_cgroups,
    ),
    Case(
        "gvisor",
        GVisorConfig().load,
        marks=(pytest.mark.requires_sandbox, pytest.mark.requires_runsc),
        not_applicable=_GVISOR_NA,
        known_failures=_GVISOR_KNOWN,
    ),
    Case("fake", FakeBackend, isolates=False, not_applicable=_FAKE_NA),
    Case(
        "microvm",
        _microvm,
        marks=(
            pytest.mark.requires_qemu,
            pytest.mark.requires_root,
            pytest.mark.requires_cgroup,
            pytest.mark.slow,
        ),
        not_applicable=_microvm_na(),
    ),
)


def by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)
