"""`corral view`'s forward to the product is relayed in the run's forward helper (issue 10).

The attack: a product floods every connection opened from the viewer
sandbox's loopback (where Chromium, driven by the product's own pages,
connects) and nothing reads them, so every relay stalls with full buffers.
What the host observes, from the kernel: both sockets of every relay are
charged to the run's `helpers-forward` cgroup (its TCP counter), and the
process that drives the view (here the test itself, as `corral view` is)
holds no socket per connection. Before, the view relayed on a thread of its
own process: two sockets per connection there, nothing in the run cgroup.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from corral.run.runcg import RunCgroup
from corral.sandbox.backend import backend_config, load_backend
from corral.viewer.stack import ViewPlan, ViewStack
from tests.integration.run.helpers import new_id
from tests.integration.viewer.conftest import PORT, product_spec

pytestmark = [
    pytest.mark.requires_sandbox,
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
    pytest.mark.requires_chromium,
    pytest.mark.timeout(90),
]

KiB, MiB = 1 << 10, 1 << 20
CONNS = 32

FLOOD = """
import os, selectors, socket
s = socket.create_server(("127.0.0.1", int(os.environ["PORT"])), backlog=256)
s.setblocking(False)
sel = selectors.DefaultSelector(); sel.register(s, selectors.EVENT_READ)
b = bytes(1 << 16)
while True:
    for k, _ in sel.select():
        if k.fileobj is s:
            c = s.accept()[0]; c.setblocking(False); sel.register(c, selectors.EVENT_WRITE)
        else:
            try:
                k.fileobj.send(b)
            except BlockingIOError:
                pass
            except OSError:
                sel.unregister(k.fileobj)
"""


def _sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return n


def _forward_tcp(cg: RunCgroup) -> int:
    d = Path(cg.cgroup.dirs["memory"], "helpers-forward")
    return int((d / "memory.kmem.tcp.usage_in_bytes").read_text())


def test_a_flooded_view_forward_is_charged_to_the_run(tmp_path: Path) -> None:
    cg = RunCgroup.detect(new_id())
    assert cg is not None
    cg.create(2 << 30)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "flood.py").write_text(FLOOD)
    (tmp_path / "scratch").mkdir()
    spec = product_spec(tmp_path / "scratch", "flood.py", product=tmp_path / "p")
    plan = ViewPlan(
        spec,
        PORT,
        None,
        15.0,
        tmp_path / "viewer",
        parent_cgroup=cg.relpath,
        run_cgroup=cg.key,
    )
    be = load_backend(backend_config("namespace"))
    forwards: list[str] = []
    clients: list[socket.socket] = []
    try:
        stack = ViewStack(plan, product_backend=be, viewer_backend=be, on_forward=forwards.append)
        try:
            assert stack.viewer is not None
            base_tcp, base_socks = _forward_tcp(cg), _sockets()
            for _ in range(CONNS):
                c = stack.viewer.net.connect(PORT)
                c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                clients.append(c)
            want = CONNS * 320 * KiB
            deadline = time.monotonic() + 30
            # Decided from the kernel's counter, not from elapsed time.
            while _forward_tcp(cg) - base_tcp < want and time.monotonic() < deadline:
                time.sleep(0.05)
            grew, socks = _forward_tcp(cg) - base_tcp, _sockets() - base_socks
            print(
                f"{CONNS} stalled view forwards: helpers-forward TCP +{grew / MiB:.1f} MiB, "
                f"sockets of the view's process +{socks} ({CONNS} are the test's clients)"
            )
            assert len(forwards) >= CONNS  # each journaled
            assert grew >= want, f"helpers-forward TCP grew {grew / MiB:.1f} MiB"
            assert socks <= CONNS + 2, f"the view's process holds {socks - CONNS} relay sockets"
        finally:
            for c in clients:
                c.close()
            stack.close()
    finally:
        cg.sweep()


def test_a_view_whose_run_cgroup_is_gone_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """Fail closed: no run cgroup to charge the forward to, no view (and no sandbox)."""
    from corral.errors import HelperError

    (tmp_path / "scratch").mkdir()
    spec = product_spec(tmp_path / "scratch", "server.py")
    plan = ViewPlan(spec, PORT, None, 15.0, tmp_path / "viewer", run_cgroup=new_id())
    be = load_backend(backend_config("namespace"))
    with pytest.raises(HelperError, match="layer run cgroup"):
        ViewStack(plan, product_backend=be, viewer_backend=be, on_forward=lambda _t: None)
    assert not (tmp_path / "scratch" / "stdout.log").exists()  # the product never started
