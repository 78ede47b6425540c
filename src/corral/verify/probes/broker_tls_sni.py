"""Broker TLS interception: the ClientHello's server name must be the CONNECT host (M3).

Inside a tunnel the broker intercepts (a method rule covers the allowed
destination), a ClientHello naming another server is refused before any TLS
is completed and journaled (`sni-mismatch`): the SNI can never pick an
upstream or a leaf. On the bare host the probe reaches the forbidden
loopback service directly.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, HitLogged, JournalHas, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

PROBES: list[Probe] = [
    Probe(
        "net-tls-sni-mismatch-intercepted",
        "network",
        "M3",
        "inside an intercepted TLS tunnel to the allowed destination, a ClientHello whose "
        "server name is another host, then a request for the forbidden loopback service",
        code("""
          tls_tunnel_secret("request after a mismatched SNI", sni="forbidden.corral-verify.invalid")
          """),
        # Denied only when B saw nothing *and* the broker journaled the mismatch.
        AnyOf((HitLogged(("http_b",)), SecretSeen(("http_b",)), JournalHas(("sni-mismatch",)))),
        allow=("{http_a_host}:{http_a_port}",),
        needs=frozenset({"broker", "journal"}),
        broker_config=(
            '[[rules]]\nid = "tls-a-get"\nhost = "{http_a_host}"\nports = [{http_a_port}]\n'
            'methods = ["GET"]\nallow_private = true\n'
        ),
    ),
]
