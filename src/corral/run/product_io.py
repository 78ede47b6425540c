"""The product's host-side chores: its data directory, readiness on every port, setid clean-up.

Apart from `corral.run.product` (pure: validation and environment), which the
mission parser imports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from corral.run.product import data_dir

if TYPE_CHECKING:
    from corral.run.environments import RunLayout
    from corral.run.mission import ProductSettings
    from corral.sandbox.backend import SandboxNet
    from corral.sandbox.setid import StripReport

__all__ = ["ensure_data_dir", "probe_all", "strip_data_setid"]


def ensure_data_dir(layout: RunLayout) -> Path:
    d = data_dir(layout)
    # 0700 like the run directory: only the sandboxes it is bound into reach it.
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def probe_all(
    ns: SandboxNet,
    product: ProductSettings,
    alive: Callable[[], bool],
    probe: Callable[[SandboxNet, int, str | None, float, Callable[[], bool]], tuple[bool, str]],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, str]:
    """`probe` each port in turn within one `ready_timeout` (`ready_path` on `port` only).

    The timeout is measured by `clock`: the run's, which stops while it is
    paused (the product is frozen with it and cannot get ready meanwhile);
    `probe` gets the time left by it and should use the same clock.
    """
    deadline = clock() + product.ready_timeout
    whys: list[str] = []
    for port in product.all_ports:
        path = product.ready_path if port == product.port else None
        left = max(0.1, deadline - clock())
        ready, why = probe(ns, port, path, left, alive)
        if not ready:
            return False, why
        whys.append(why)
    return True, "; ".join(whys)


def strip_data_setid(layout: RunLayout) -> StripReport | None:
    """Clear setuid/setgid modes the product left in its data directory (None: no directory)."""
    from corral.sandbox.setid import strip_setid

    d = data_dir(layout)
    if not d.is_dir():
        return None
    return strip_setid(str(d))
