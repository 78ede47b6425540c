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
          import ssl
          px = proxy()
          b = "127.0.0.1:%d" % P["http_b_port"]
          if px:
              try:
                  s = socket.create_connection((px[0], px[1]), timeout=5)
                  s.sendall(("CONNECT %s:%d HTTP/1.1\\r\\nHost: %s:%d\\r\\n\\r\\n" % (
                      P["http_a_host"], P["http_a_port"], P["http_a_host"],
                      P["http_a_port"])).encode())
                  head = b""
                  while b"\\r\\n\\r\\n" not in head:
                      chunk = s.recv(1)
                      if not chunk:
                          break
                      head += chunk
                  ctx = ssl.create_default_context()
                  ctx.check_hostname = False
                  ctx.verify_mode = ssl.CERT_NONE
                  t = ctx.wrap_socket(s, server_hostname="forbidden.corral-verify.invalid")
                  t.sendall(("GET /secret/%s HTTP/1.1\\r\\nHost: %s\\r\\n"
                             "Connection: close\\r\\n\\r\\n" % (MARKER, b)).encode())
                  r = b""
                  while True:
                      chunk = t.recv(65536)
                      if not chunk:
                          break
                      r += chunk
                  net_report("request after a mismatched SNI", r, None)
              except (OSError, ssl.SSLError) as e:
                  net_report("request after a mismatched SNI", None, e)
          else:
              r, e = tcp("127.0.0.1", P["http_b_port"], b_req(b))
              net_report("request after a mismatched SNI", r, e)
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
