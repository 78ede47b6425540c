"""The probe catalogue: one module per category, each exporting `PROBES`."""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.probes import (
    audit,
    files,
    host_integrity,
    network,
    privilege,
    processes,
    resources,
    secrets,
    unix_sockets,
    usability,
)
from corral.verify.probes._prelude import PRELUDE

__all__ = ["PRELUDE", "all_probes"]


def all_probes() -> list[Probe]:
    """Every probe, in report order; ids are unique."""
    probes = [
        *files.PROBES,
        *network.PROBES,
        *secrets.PROBES,
        *processes.PROBES,
        *host_integrity.PROBES,
        *resources.PROBES,
        *privilege.PROBES,
        *audit.PROBES,
        *usability.PROBES,
        *unix_sockets.PROBES,
    ]
    seen: set[str] = set()
    for p in probes:
        if p.id in seen:
            raise ValueError(f"duplicate probe id {p.id}")
        seen.add(p.id)
    return probes
