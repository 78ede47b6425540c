"""The broker's live-policy control channel, attacked from the sandbox (M3).

`corral exec --run ID` gives its broker a control socket on the host
(docs/broker.md "Live policy"): whoever reaches it can add an allow rule. The
probe runs with `--run` so that socket exists on the host while it runs,
looks for it everywhere a sandboxed process could (the host paths it would
have, `/proc/net/unix`, abstract names), sends an allow rule for the
forbidden loopback service B to whatever answers, then asks for B's secret
through the proxy. Judged on the host: B logged a hit, or its secret reached
the output. On the bare host (no broker) the request reaches B directly.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, HitLogged, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

PROBES: list[Probe] = [
    Probe(
        "net-broker-control-from-sandbox",
        "network",
        "M3",
        "reach the broker's live-policy control socket (host path, /proc/net/unix, abstract "
        "names), add an allow rule for the loopback service B, then fetch B through the proxy",
        code("""
          import glob
          run = "verify-ctl-" + MARKER
          name = "run-exec.sock"
          cands = host_sockets([], ["/control/", "/exec/"])
          bases = ["/tmp", "/run", os.environ.get("XDG_RUNTIME_DIR") or "/tmp"]
          for base in bases + glob.glob("/run/user/*"):
              for uid in {0, os.getuid(), 1000}:
                  cands.add("%s/corral-%d/exec/%s/%s" % (base, uid, run, name))
          # Only corral's own control paths: other sockets on the host are not the target.
          for pat in ("/tmp/corral-*/exec/*/*.sock", "/run/user/*/corral-*/exec/*/*.sock",
                      "../*/control/*.sock", "../../*/control/*.sock"):
              cands.update(glob.glob(pat))
          abstract = ["\\0" + c for c in sorted(cands) if not c.startswith("@")]
          abstract += ["\\0" + name, "\\0corral-control", "\\0" + run]
          rule = {"host": "127.0.0.1", "ports": [P["http_b_port"]], "allow_private": True,
                  "id": "live:verify-" + MARKER}
          took = []
          for addr in sorted(cands) + abstract:
              if addr.startswith("@"):
                  addr = "\\0" + addr[1:]
              s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
              s.settimeout(3)
              try:
                  s.connect(addr)
                  s.sendall((json.dumps({"op": "add_rule", "rule": rule}) + "\\n").encode())
                  took.append((addr.replace("\\0", "@"), s.recv(4096).decode("latin-1")[:200]))
              except OSError as e:
                  pass
              finally:
                  s.close()
          show("control sockets answering", repr(took))
          r, e = via_proxy_or_direct("127.0.0.1", P["http_b_port"], "/secret/" + MARKER)
          net_report("B after the rule attempt", r, e)
          """),
        # Denied only when B saw nothing: a rule the sandbox managed to add
        # would have let the proxied request through.
        AnyOf((HitLogged(("http_b",)), SecretSeen(("http_b",)))),
        allow=("{http_a_host}:{http_a_port}",),
        needs=frozenset({"broker", "journal"}),
        exec_args=("--run", "verify-ctl-{marker}"),
    ),
]
