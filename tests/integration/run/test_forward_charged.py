"""Every byte of a forwarded connection is charged to the run, none to the coordinator (issue 10).

The attack: a product floods every connection a verifier opens through the
product-port forward, and the verifier reads none of them, so each relay
stalls with its kernel buffers full. The product is a real network
namespace (the namespace backend's `NetNs`); the coordinator's side of the
forward (`HelperForwarder`) runs in a child process placed in a memory
cgroup of its own, with socket accounting on, so the kernel says what the
coordinator pays. What the host observes, from the kernel:

* the run's TCP counter (`memory.kmem.tcp.usage_in_bytes` of
  `helpers-forward` and of the run cgroup above it) holds both sockets of
  every relay: the product's side as well as the verifier's;
* the coordinator's TCP counter stays flat, as do its VmRSS and the sockets
  in its /proc/PID/fd: O(1) per run, whatever the number of connections.

Before the product's side was connected in the helper, the coordinator's
counter grew by ~256 KiB per stalled connection.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.run.runcg import RunCgroup
from tests.integration.run.helpers import new_id

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_cgroup, pytest.mark.timeout(60)]

KiB, MiB = 1 << 10, 1 << 20
CONNS = 48
PORT = 8000

#: The product: a server on 127.0.0.1:PORT of a fresh network namespace that
#: writes to every connection for as long as writes are taken.
_PRODUCT = f"""
import selectors, socket, sys
s = socket.create_server(("127.0.0.1", {PORT}), backlog=256); s.setblocking(False)
sel = selectors.DefaultSelector(); sel.register(s, selectors.EVENT_READ)
b = bytes(1 << 16)
print("ready", flush=True)
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

#: The coordinator's side of the forward, as `corral run` drives it: a
#: listener it made (the verifier's stand-in: host loopback) handed to the
#: forward helper, the product reached through its `NetNs`.
_COORDINATOR = """
import socket, sys
from pathlib import Path
from corral.run.forward_helper import HelperForwarder
from corral.sandbox.netns import NetNs
product_pid, port, log, procs = sys.argv[1:5]
net = NetNs(int(product_pid))
fwd = HelperForwarder(lambda _target: None, procs.split(":"), Path(log))
listener = socket.create_server(("127.0.0.1", 0), backlog=256)
addr = listener.getsockname()
fwd.expose(listener, net, int(port))
print(f"ready {addr[1]} {fwd.pid}", flush=True)
sys.stdin.read()
fwd.close()
"""

_JOIN = 'for f in $JOIN; do echo 0 > "$f" || exit 125; done; unset JOIN; exec "$@"'


def _tcp(cg: RunCgroup, helper: str | None = None) -> int:
    d = cg.cgroup.dirs["memory"]
    if helper is not None:
        d = os.path.join(d, f"helpers-{helper}")
    return int(Path(d, "memory.kmem.tcp.usage_in_bytes").read_text())


def _vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * KiB
    return 0


def _sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return n


@pytest.fixture
def cgroups() -> Iterator[tuple[RunCgroup, RunCgroup]]:
    """(the run's cgroup, the coordinator's), each capped at 1 GiB: 64 MiB of TCP."""
    made = []
    try:
        for _ in range(2):
            cg = RunCgroup.detect(new_id())
            assert cg is not None
            cg.create(1 << 30)
            made.append(cg)
        yield made[0], made[1]
    finally:
        for cg in made:
            cg.sweep()


def _in_netns(code: str) -> subprocess.Popen[str]:
    """`code` run by Python in a fresh network namespace with its loopback up."""
    up = 'ip link set lo up && exec "$@"'
    return subprocess.Popen(
        ["unshare", "-n", "sh", "-c", up, "product", sys.executable, "-I", "-c", code],
        stdout=subprocess.PIPE,
        text=True,
    )


def _readline(proc: subprocess.Popen[str], what: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"{what} exited {proc.wait(5)} before it was ready"
    return line.strip()


def test_stalled_forwards_are_charged_to_the_run_not_to_the_coordinator(
    cgroups: tuple[RunCgroup, RunCgroup], tmp_path: Path
) -> None:
    run, coord = cgroups
    product = _in_netns(_PRODUCT)
    coordinator: subprocess.Popen[str] | None = None
    clients: list[socket.socket] = []
    try:
        assert _readline(product, "the product") == "ready"
        args = (str(product.pid), str(PORT), str(tmp_path / "forward.log"))
        helper_cg = ":".join(run.helper_procs("forward"))
        coordinator = subprocess.Popen(
            [
                "/bin/sh",
                "-c",
                _JOIN,
                "coordinator",
                sys.executable,
                "-c",
                _COORDINATOR,
                *args,
                helper_cg,
            ],
            env={**os.environ, "JOIN": " ".join(coord.cgroup.procs_files())},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        _, port, helper = _readline(coordinator, "the coordinator").split()
        assert int(helper) in run.pids() and coordinator.pid in coord.pids()
        base = (_tcp(coord), _vm_rss(coordinator.pid), _sockets(coordinator.pid))
        base_run = _tcp(run)
        for _ in range(CONNS):
            c = socket.socket()
            # Smallest receive queue: the verifier reads nothing, the relay stalls at once.
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", int(port)))
            clients.append(c)
        # Decided from the counters: wait until the stalled relays' buffers
        # are charged somewhere (the run's or the coordinator's counter).
        want = CONNS * 320 * KiB
        deadline = time.monotonic() + 20
        while _tcp(run) - base_run + _tcp(coord) - base[0] < want:
            assert time.monotonic() < deadline, (
                f"relays never filled: run {(_tcp(run) - base_run) / MiB:.1f} MiB, "
                f"coordinator {(_tcp(coord) - base[0]) / MiB:.1f} MiB"
            )
            time.sleep(0.05)
        fwd_tcp, run_tcp = _tcp(run, "forward"), _tcp(run) - base_run
        coord_tcp = _tcp(coord) - base[0]
        rss = _vm_rss(coordinator.pid) - base[1]
        socks = _sockets(coordinator.pid) - base[2]
        print(
            f"{CONNS} stalled forwards: run TCP +{run_tcp / MiB:.1f} MiB "
            f"(helpers-forward {fwd_tcp / MiB:.1f} MiB), coordinator TCP "
            f"+{coord_tcp / MiB:.2f} MiB, VmRSS +{rss / MiB:.2f} MiB, sockets +{socks}"
        )
        # Both sockets of every relay are the run's: more than one full
        # receive queue (2 x 128 KiB) per connection...
        assert fwd_tcp >= want, f"helpers-forward TCP {fwd_tcp / MiB:.1f} MiB"
        # ...and the coordinator pays O(1): not a socket buffer per connection.
        assert coord_tcp < 1 * MiB, f"coordinator TCP grew {coord_tcp / MiB:.1f} MiB"
        assert rss < 4 * MiB, f"coordinator VmRSS grew {rss / MiB:.1f} MiB"
        assert socks <= 2, f"coordinator holds {socks} more sockets"
    finally:
        for c in clients:
            c.close()
        if coordinator is not None:
            assert coordinator.stdin is not None
            coordinator.stdin.close()
            try:
                coordinator.wait(10)
            except subprocess.TimeoutExpired:
                coordinator.kill()
                coordinator.wait()
            assert coordinator.stdout is not None
            coordinator.stdout.close()
        product.kill()
        product.wait()
        assert product.stdout is not None
        product.stdout.close()


#: Answers every connection with how many it accepted so far, then echoes.
_COUNTING = f"""
import socket, threading
s = socket.create_server(("127.0.0.1", {PORT}))
print("ready", flush=True)
n = 0
def serve(c, k):
    with c:
        while d := c.recv(65536):
            c.sendall(b"%d:" % k + d)
while True:
    c = s.accept()[0]
    n += 1
    threading.Thread(target=serve, args=(c, n), daemon=True).start()
"""


def test_a_dialled_product_is_connected_only_after_the_journal_said_yes(
    cgroups: tuple[RunCgroup, RunCgroup], tmp_path: Path
) -> None:
    from corral.run.forward_helper import HelperForwarder
    from corral.sandbox.netns import NetNs

    run, _ = cgroups
    product = _in_netns(_COUNTING)
    verdicts = [False, True]
    journaled: list[str] = []

    def on_connect(target: str) -> None:
        journaled.append(target)
        if not verdicts.pop(0):
            raise OSError("journal write failed")

    net: NetNs | None = None
    fwd: HelperForwarder | None = None
    try:
        assert _readline(product, "the product") == "ready"
        net = NetNs(product.pid)
        fwd = HelperForwarder(on_connect, run.helper_procs("forward"), tmp_path / "forward.log")
        listener = socket.create_server(("127.0.0.1", 0))
        addr = listener.getsockname()
        fwd.expose(listener, net, PORT)
        with socket.create_connection(addr, timeout=10) as c:
            c.sendall(b"refused")
            assert c.recv(100) == b""  # the journal refused: closed, nothing relayed
        with socket.create_connection(addr, timeout=10) as c:
            c.sendall(b"hello")
            # The product's first connection: the refused one never reached it.
            assert c.recv(100) == b"1:hello"
        assert journaled == [f"product:127.0.0.1:{PORT}"] * 2
    finally:
        if fwd is not None:
            fwd.close()
        if net is not None:
            net.close()
        product.kill()
        product.wait()
        assert product.stdout is not None
        product.stdout.close()
