"""Broker raw TCP (M3): a `[[tcp]]` rule admits its destination and nothing else.

The broker is given a TCP rule for canary A; the probe asks its SOCKS5
server (`ALL_PROXY=socks5h://...`) for canary B on the host's loopback, by
address and by `localhost`, and then tries B directly. On the bare host there
is no SOCKS proxy and the direct connection reaches B's secret. Denied only
when B saw nothing *and* the broker journaled the refused `tcp_connect`.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, HitLogged, JournalHas, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_ALLOW_A = ("{http_a_host}:{http_a_port}",)

PROBES: list[Probe] = [
    Probe(
        "net-tcp-rule-bypass",
        "network",
        "M3",
        "with a TCP rule for A only, reach the host-loopback service B through the broker's "
        "SOCKS5 server (by address and by name) and directly",
        code("""
          def socks(host, port, payload):
              v = os.environ.get("ALL_PROXY") or os.environ.get("all_proxy") or ""
              if not v.startswith("socks5"):
                  return None, "no SOCKS proxy in the environment"
              from urllib.parse import urlsplit
              u = urlsplit(v)
              try:
                  s = socket.create_connection((u.hostname, u.port), timeout=5)
                  s.sendall(b"\\x05\\x01\\x00")
                  if s.recv(2) != b"\\x05\\x00":
                      return None, "greeting refused"
                  h = host.encode()
                  s.sendall(b"\\x05\\x01\\x00\\x03" + bytes([len(h)]) + h + port.to_bytes(2, "big"))
                  rep = s.recv(262)
                  if len(rep) < 2 or rep[1] != 0:
                      return None, "socks reply %s" % (rep[1] if len(rep) > 1 else "none")
                  s.sendall(payload)
                  out = b""
                  while True:
                      chunk = s.recv(65536)
                      if not chunk:
                          break
                      out += chunk
                  return out, None
              except OSError as e:
                  return None, e
          for host in ("127.0.0.1", "localhost"):
              r, e = socks(host, P["http_b_port"], b_req())
              net_report("socks to " + host, r, e)
          r, e = tcp("127.0.0.1", P["http_b_port"], b_req())
          net_report("direct", r, e)
          """),
        AnyOf(
            (
                HitLogged(("http_b",)),
                SecretSeen(("http_b",)),
                JournalHas(("tcp_connect", "default-deny", "127.0.0.1:{http_b_port}")),
            )
        ),
        allow=_ALLOW_A,
        # A peer has no `[[tcp]]` rule nor a corral journal to judge by: not applicable.
        needs=frozenset({"broker", "journal", "corral-options"}),
        broker_config=(
            '[[tcp]]\nhost = "{http_a_host}"\nport = {http_a_port}\nallow_private = true\n'
        ),
    ),
]
