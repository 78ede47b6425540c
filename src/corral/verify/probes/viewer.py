"""M11: a hostile product looked at through `corral view` never reaches the host browser.

One host-driven run per backend (`corral.verify.viewer_drive`): the product's
page tries a host canary, sets a cookie, opens popups and embeds its secret;
a host Chromium (Playwright, Debian's binary) opens the viewer page
(namespace) or the product itself (`none`: no viewer isolation). Each probe
judges one host-side effect of that run.
"""

from __future__ import annotations

from corral.verify.model import Probe
from corral.verify.oracles import Fact

__all__ = ["PROBES"]


def _probe(pid: str, desc: str, fact: str, meaning: str, expected: str = "denied") -> Probe:
    # The one usability check of the run: the viewer still shows the product (U9).
    usable = expected == "allowed"
    return Probe(
        pid,
        "usability" if usable else "host-integrity",
        "U9" if usable else "M11",
        desc,
        "",
        Fact(fact, meaning),
        expected=expected,  # type: ignore[arg-type]
        viewer=True,
        deadline_s=90.0,
        serial=True,
    )


PROBES = [
    _probe(
        "view-canary",
        "the product's page fetches/loads/WebSockets a host loopback canary",
        "canary",
        "the host canary was contacted",
    ),
    _probe(
        "view-secret",
        "the product's page embeds its secret; the host browser must never receive it",
        "secret",
        "a response to the host browser held the product's secret",
    ),
    _probe(
        "view-product-origin",
        "the host browser loads a product origin URL as a resource",
        "product_origin",
        "the host browser loaded product-origin URLs",
    ),
    _probe(
        "view-cookie",
        "the product's script sets a cookie in the host browser",
        "cookie",
        "the host browser holds the product's cookie",
    ),
    _probe(
        "view-popup",
        "the product's script opens popups in the host browser",
        "popup",
        "the host browser opened the product's popups",
    ),
    _probe(
        "view-shows-product",
        "the product is still shown (its colour is in what the user sees)",
        "shown",
        "the product's colour is in the view",
        expected="allowed",
    ),
]
