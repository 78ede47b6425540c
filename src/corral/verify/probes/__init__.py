"""The probe catalogue: one module per category, each exporting `PROBES`."""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.probes import (
    audit,
    broker_control,
    broker_tls,
    browser_check,
    files,
    footprint,
    host_executed,
    host_integrity,
    hostile_files,
    network,
    presentation,
    privilege,
    processes,
    report_forgery,
    resources,
    secrets,
    session_record,
    terminal_and_uids,
    unix_sockets,
    usability,
    viewer,
)
from corral.verify.probes import broker_tcp as broker_tcp_mod
from corral.verify.probes import broker_tls_sni as broker_tls_sni_mod
from corral.verify.probes import check_reasons as check_reasons_mod
from corral.verify.probes import footprint_pages as footprint_pages_mod
from corral.verify.probes import kernel_denials as kernel_denials_mod
from corral.verify.probes import launcher as launcher_mod
from corral.verify.probes import prefork as prefork_mod
from corral.verify.probes import resident_broker as resident_broker_mod
from corral.verify.probes import viewer_devtools as viewer_devtools_mod
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
        *host_executed.PROBES,
        *resources.PROBES,
        *privilege.PROBES,
        *audit.PROBES,
        *usability.PROBES,
        *presentation.PROBES,
        *terminal_and_uids.PROBES,
        *report_forgery.PROBES,
        *hostile_files.PROBES,
        *session_record.PROBES,
        *unix_sockets.PROBES,
        *footprint.PROBES,
        *broker_tls.PROBES,
        *viewer.PROBES,
        *broker_tcp_mod.PROBES,
        *broker_control.PROBES,
        *check_reasons_mod.PROBES,
        *browser_check.PROBES,
        *kernel_denials_mod.PROBES,
        *broker_tls_sni_mod.PROBES,
        *footprint_pages_mod.PROBES,
        *resident_broker_mod.PROBES,
        *viewer_devtools_mod.PROBES,
        *launcher_mod.PROBES,
        *prefork_mod.PROBES,
    ]
    seen: set[str] = set()
    for p in probes:
        if p.id in seen:
            raise ValueError(f"duplicate probe id {p.id}")
        seen.add(p.id)
    return probes
