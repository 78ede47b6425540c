"""The gVisor bundle shows `NetworkSpec.trust_bundle` at the system bundle's path (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.sandbox.gvisor import bundle as bd
from corral.sandbox.spec import NetworkSpec, SandboxSpec

SPEC = SandboxSpec(argv=("true",), workspace="/home/u/ws", env=(("PATH", "/usr/bin"),))


@pytest.mark.parametrize("etc_dir", [None, "/run/corral-gvisor/x/bundle/etc"])
def test_trust_bundle_is_bound_over_the_system_bundle_after_etc(etc_dir: str | None) -> None:
    spec = replace(SPEC, network=NetworkSpec(trust_bundle="/tmp/corral-tls-x/ca/public/bundle.pem"))
    plan = bd.BundlePlan(
        spec=spec,
        system_links=(),
        etc_entries=("ssl",),
        binds=(),
        files_dir="/run/corral-gvisor/x/bundle/files",
        etc_dir=etc_dir,
    )
    mounts = bd.build_config(plan)["mounts"]
    assert isinstance(mounts, list)
    dests = [m["destination"] for m in mounts]
    i = dests.index("/etc/ssl/certs/ca-certificates.crt")
    assert mounts[i] == {
        "destination": "/etc/ssl/certs/ca-certificates.crt",
        "type": "bind",
        "source": "/tmp/corral-tls-x/ca/public/bundle.pem",
        "options": ["rbind", "ro", "nosuid", "nodev"],
    }
    # Later than /etc (or /etc/ssl): the sentry mounts in order.
    assert i > max(j for j, d in enumerate(dests) if d in ("/etc", "/etc/ssl"))


def test_no_trust_bundle_no_mount() -> None:
    plan = bd.BundlePlan(spec=SPEC, system_links=(), etc_entries=("ssl",), binds=(), files_dir="/f")
    mounts = bd.build_config(plan)["mounts"]
    assert isinstance(mounts, list)
    assert all(m["destination"] != "/etc/ssl/certs/ca-certificates.crt" for m in mounts)
