"""The forward helper's protocol against loopback stand-ins (no sandbox needed).

The product is a server on the host's loopback and the "verifier namespace"
listener a host socket: what is under test is the helper, its control
socket and the coordinator's side of it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import HelperError
from corral.run.forward_helper import HelperForwarder
from corral.run.runcg import RunCgroup
from tests.integration.run.helpers import new_id

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup, pytest.mark.timeout(60)]


class _Loopback:
    """A SandboxNet whose 127.0.0.1 is the host's."""

    def __init__(self) -> None:
        self.connects = 0

    def listen(self, port: int) -> socket.socket:
        return socket.create_server(("127.0.0.1", 0))

    def connect(self, port: int) -> socket.socket:
        self.connects += 1
        return socket.create_connection(("127.0.0.1", port))


@pytest.fixture
def cg() -> Iterator[RunCgroup]:
    cg = RunCgroup.detect(new_id())
    assert cg is not None
    cg.create(256 << 20)
    try:
        yield cg
    finally:
        cg.sweep()


def _echo_server() -> socket.socket:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                while data := c.recv(65536):
                    c.sendall(b"product:" + data)

    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_each_connection_is_journaled_before_it_is_relayed(cg: RunCgroup, tmp_path: Path) -> None:
    srv = _echo_server()
    port = srv.getsockname()[1]
    net = _Loopback()
    order: list[str] = []

    def on_connect(target: str) -> None:
        # The "journal": when this runs the product has not been connected yet.
        order.append(f"journal {target} connects={net.connects}")

    fwd = HelperForwarder(on_connect, cg.helper_procs("forward"), tmp_path / "forward.log")
    try:
        assert fwd.pid in cg.pids()
        listener = net.listen(port)
        addr = listener.getsockname()
        stop = fwd.expose(listener, net, port)
        assert listener.fileno() == -1  # handed over, not kept by the coordinator
        with socket.create_connection(addr, timeout=10) as c:
            c.sendall(b"hello")
            assert c.recv(100) == b"product:hello"
        assert order == [f"journal product:127.0.0.1:{port} connects=0"]
        stop()
    finally:
        fwd.close()
        srv.close()
    assert fwd.dead() is not None


def test_a_connection_the_journal_refuses_is_never_relayed(cg: RunCgroup, tmp_path: Path) -> None:
    srv = _echo_server()
    port = srv.getsockname()[1]
    net = _Loopback()

    def on_connect(target: str) -> None:
        raise OSError("journal write failed")

    fwd = HelperForwarder(on_connect, cg.helper_procs("forward"), tmp_path / "forward.log")
    try:
        listener = net.listen(port)
        addr = listener.getsockname()
        fwd.expose(listener, net, port)
        with socket.create_connection(addr, timeout=10) as c:
            c.sendall(b"hello")
            assert c.recv(100) == b""  # closed by the helper, nothing relayed
        assert net.connects == 0
    finally:
        fwd.close()
        srv.close()


def test_a_forwarder_without_a_run_cgroup_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HelperError, match="layer run cgroup"):
        HelperForwarder(lambda _t: None, (), tmp_path / "forward.log")
    with pytest.raises(HelperError, match="layer run cgroup"):
        HelperForwarder(lambda _t: None, ("/proc/self/nonexistent/cgroup.procs",), tmp_path / "l")
