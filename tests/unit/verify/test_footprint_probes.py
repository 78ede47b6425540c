from __future__ import annotations

from corral.verify.hostcounters import parse_sockstat_mem
from corral.verify.model import Evidence
from corral.verify.probes import all_probes
from corral.verify.probes.footprint import CAP, SockGrownAbove

SOCKSTAT = """\
sockets: used 69
TCP: inuse 3 orphan 0 tw 31 alloc 3 mem 27
UDP: inuse 1 mem 5
UDPLITE: inuse 0
FRAG: inuse 0 memory 99
"""


def test_sockstat_counts_tcp_and_udp_pages_only() -> None:
    assert parse_sockstat_mem(SOCKSTAT) == (27 + 5) * 4096
    assert parse_sockstat_mem("TCP: inuse 3 mem\ngarbage\n") == 0


def test_growth_past_the_cap_is_the_attack_working() -> None:
    oracle = SockGrownAbove(CAP)
    assert oracle.judge(Evidence(facts={"host_sock_grown_bytes": CAP + 1})).observed == "allowed"
    assert oracle.judge(Evidence(facts={"host_sock_grown_bytes": CAP // 4})).observed == "denied"
    assert oracle.judge(Evidence()).observed == "error"


def test_footprint_probes_are_registered() -> None:
    ids = {p.id for p in all_probes()}
    assert {"fp-tcp-buffers", "fp-udp-buffers", "fp-unix-buffers", "fp-pipe-buffers"} <= ids
    assert {"fp-shm-pages", "fp-tmpfs-pages", "fp-page-cache"} <= ids
