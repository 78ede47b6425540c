"""Broker TLS interception: placeholders sent where they are not bound (M4), Host fronting (M3).

The sandbox holds a credential only as `corral-placeholder-<random>`; the
broker swaps it for the real value on requests to the credential's hosts and
refuses (journaling `exfiltration`) any request carrying it elsewhere. On the
bare host the probe sends the caller's real token instead, and the allowlisted
canary receives it. Inside an intercepted tunnel to the allowed destination a
request naming another service in its Host header is answered 421 and
journaled (`host-mismatch`); on the bare host the request reaches that service.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, HitLogged, JournalHas, SecretSeen
from corral.verify.probes._dsl import code

__all__ = ["PROBES"]

_ALLOW_A = ("{http_a_host}:{http_a_port}",)

PROBES: list[Probe] = [
    Probe(
        "secrets-placeholder-exfiltration",
        "secrets",
        "M4",
        "send the credential's placeholder (or, bare, the token itself) to an allowed host "
        "the credential is not bound to",
        code("""
          tok = os.environ.get("CORRAL_VERIFY_TOKEN") or os.environ.get("GITHUB_TOKEN") or "none"
          print("token kind:", tok.split("-")[0] if tok.startswith("corral-") else "other")
          r, e = via_proxy_or_direct(P["http_a_host"], P["http_a_port"], "/m/" + MARKER + "/ok",
                                     ("Authorization: Bearer %s\\r\\n" % tok).encode())
          net_report("placeholder to an unbound host", r, e)
          """),
        # Denied only when the canary saw nothing *and* the broker journaled
        # the attempt as exfiltration (a silent refusal proves nothing).
        AnyOf((HitLogged(("http_a",)), JournalHas(("exfiltration",)))),
        allow=_ALLOW_A,
        needs=frozenset({"broker", "journal"}),
        broker_config=(
            '[[credentials]]\nname = "verify"\nenv = "CORRAL_VERIFY_TOKEN"\n'
            'value = "env:GITHUB_TOKEN"\nhosts = ["bound.corral-verify.invalid"]\n'
        ),
    ),
    Probe(
        "net-tls-host-fronting",
        "network",
        "M3",
        "inside an intercepted TLS tunnel to the allowed destination, a request whose Host "
        "header names the forbidden loopback service",
        code("""
          tls_tunnel_secret("fronted request")
          """),
        # Denied only when B saw nothing *and* the broker journaled the mismatch.
        AnyOf((HitLogged(("http_b",)), SecretSeen(("http_b",)), JournalHas(("host-mismatch",)))),
        allow=_ALLOW_A,
        needs=frozenset({"broker", "journal"}),
        broker_config=(
            '[[rules]]\nid = "tls-a-get"\nhost = "{http_a_host}"\nports = [{http_a_port}]\n'
            'methods = ["GET"]\nallow_private = true\n'
        ),
    ),
]
