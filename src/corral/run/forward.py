"""The product port, forwarded from the product's loopback to a verifier's loopback.

Neither sandbox has a network device besides its own loopback; each is
reached through its backend's `SandboxNet` (for a namespace sandbox,
sockets created in its network namespace: `sandbox/netns.py`). The verifier gets
a listening socket on its 127.0.0.1:PORT; each connection accepted there is
journaled (`net_connect`, env verifier, rule `product-port`) and only then
relayed to the product's 127.0.0.1:PORT. The relay is the forward helper's,
in the run cgroup (`run/forward_helper.py`, `run/forward_relay.py`); this
module keeps the readiness probe the coordinator runs before a verifier starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.sandbox.backend import SandboxNet

__all__ = ["probe_ready"]


def probe_ready(
    ns: SandboxNet,
    port: int,
    path: str | None,
    timeout_s: float,
    alive: Callable[[], bool],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, str]:
    """Poll the product until it accepts (and, with `path`, answers HTTP < 500).

    Returns (ready, reason). Gives up when `alive()` turns false (the product
    exited) or after `timeout_s` by `clock` (a run's clock stops while it is
    paused). Only a status line is read from the product.
    """
    deadline = clock() + timeout_s
    last = "no attempt"
    while clock() < deadline:
        if not alive():
            return False, f"the product exited before it was ready ({last})"
        try:
            sock = ns.connect(port)
        except OSError as exc:
            last = f"port {port}: {exc.strerror or exc}"
            time.sleep(0.1)
            continue
        try:
            sock.settimeout(max(0.1, min(2.0, deadline - clock())))
            if path is None:
                return True, f"port {port} accepts connections"
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            head = sock.recv(256).split(b"\r\n", 1)[0].decode("latin-1")
            parts = head.split()
            if len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) < 500:
                return True, f"GET {path} -> {parts[1]}"
            last = f"GET {path} -> {head[:80]!r}"
        except OSError as exc:
            last = f"port {port}: {exc.strerror or exc}"
        finally:
            sock.close()
        time.sleep(0.1)
    # `timeout_s` may be what is left of a shared budget (1.9997...): say it as set.
    return False, f"not ready after {round(timeout_s, 1):g}s ({last})"
