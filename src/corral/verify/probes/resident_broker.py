"""The resident broker's attach socket, attacked from the sandbox (M3, M15).

`corral exec` hands each sandbox's listener to a per-user resident broker
over a host unix socket (docs/broker.md "The resident broker"). Whoever
reaches that socket could attach a listener of its own with a policy of its
own. The probe looks for the socket everywhere a sandboxed process could
(the host paths it would have, `/proc/net/unix`, abstract names), sends an
attach request with a listener it made in its own network namespace and a
config allowing the forbidden loopback service B, then asks for B's secret
through that listener (and through the environment's proxy). Judged on the
host: B logged a hit, or its secret reached the output. On the bare host (no
broker) the request reaches B directly.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, HitLogged, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

PROBES: list[Probe] = [
    Probe(
        "net-resident-broker-attach-from-sandbox",
        "network",
        "M3",
        "reach the resident broker's attach socket (host paths, /proc/net/unix, abstract "
        "names), attach an own listener with a policy allowing the loopback service B, "
        "then fetch B through it",
        code("""
          import array
          cands = host_sockets(["/corral-*/broker/resident*.sock"], ["/broker/resident"])
          addrs = sorted(cands) + ["\\0" + c for c in sorted(cands)] + ["\\0corral-resident"]
          config = json.dumps({"rules": [{"host": "127.0.0.1", "ports": [P["http_b_port"]],
                                          "allow_private": True, "id": "evil-" + MARKER}],
                               "system_dns": False})
          attached = []
          for addr in addrs:
              mine = socket.socket()
              mine.bind(("127.0.0.1", 0))
              mine.listen(4)
              s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
              s.settimeout(3)
              try:
                  s.connect(addr)
                  body = json.dumps({"op": "attach", "config": config,
                                     "journal": "/tmp/j-" + MARKER,
                                     "run": "evil", "session": "evil", "env": "exec"}).encode()
                  fds = array.array("i", [mine.fileno()]).tobytes()
                  s.sendmsg([struct.pack("!I", len(body)), body],
                            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                  reply = s.recv(4096)
                  if b'"ok": true' in reply:
                      attached.append((s, mine.getsockname()[1]))
              except OSError:
                  s.close()
          show("attach sockets answering", repr([p for _, p in attached]))
          for s, port in attached:
              r, e = tcp("127.0.0.1", port,
                         http_req("http://127.0.0.1:%d/secret/%s" % (P["http_b_port"], MARKER),
                                  "127.0.0.1:%d" % P["http_b_port"], b"", "GET", b""))
              net_report("B through the attached listener", r, e)
          r, e = via_proxy_or_direct("127.0.0.1", P["http_b_port"], "/secret/" + MARKER)
          net_report("B after the attach attempt", r, e)
          """),
        AnyOf((HitLogged(("http_b",)), SecretSeen(("http_b",)))),
        allow=("{http_a_host}:{http_a_port}",),
        needs=frozenset({"broker", "journal"}),
    ),
]
