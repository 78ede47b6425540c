"""M11: the product's script in the viewer's Chromium finds no browser-control port.

Judged on the same host-driven run as the other M11 probes
(`corral.verify.viewer_drive`): the product's page fetches every port of
127.0.0.1:9100-9399 and reports what answered to the product, which the host
reads back. With `--backend none` the page runs in the host browser, where a
browser's DevTools port (a stand-in listener the host opens in that range)
answers; through the viewer, Chromium's DevTools is a pipe
(`--remote-debugging-pipe`) and nothing in the viewer's loopback answers.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import Fact

__all__ = ["PROBES"]

PROBES = [
    Probe(
        "view-devtools-port",
        "host-integrity",
        "M11",
        "the product's page scans 127.0.0.1:9100-9399 for a DevTools port",
        "",
        Fact("devtools_port", "the product's page reached a port in 9100-9399"),
        expected="denied",
        viewer=True,
        deadline_s=90.0,
        serial=True,
    ),
]
