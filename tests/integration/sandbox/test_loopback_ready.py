"""A sandbox's network namespace is handed to the host only once its `lo` is up.

bwrap reports its child's pid (when corral takes the namespace) before that
child has brought `lo` up; on Linux 6.18 a bind() to 127.0.0.1 there already
succeeds, so nothing told corral. A host-side connect() into the sandbox
then failed with ENETUNREACH (`corral view`'s viewer namespace, the flaky
tests/integration/viewer/test_view_forward_charged.py). What the host
observes now: a connect() made the moment the namespace is handed out is
refused by the sandbox's loopback (ECONNREFUSED: it is up), never
unreachable.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.errors import SandboxStartError
from corral.sandbox.backend import SandboxNet, backend_config, load_backend
from corral.sandbox.netns import NetNs
from corral.sandbox.spec import NetworkSpec, SandboxSpec

pytestmark = [pytest.mark.requires_root, pytest.mark.timeout(60)]

UNUSED_PORT = 9

# A process in a network namespace of its own whose `lo` stays down until
# the test says so (one line on stdin), as bwrap's child's does until it has
# run its loopback setup.
HOLDER = """
import ctypes, fcntl, socket, struct, sys
assert ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0  # CLONE_NEWNET
print("ready", flush=True)
if sys.stdin.readline() != "up\\n":
    sys.exit(0)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack_from("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16s24x", b"lo")))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))
print("up", flush=True)
sys.stdin.read()
"""


def _connect_errno(net: SandboxNet) -> int:
    try:
        net.connect(UNUSED_PORT).close()
    except OSError as exc:
        return exc.errno or 0
    return 0


@pytest.fixture
def holder() -> Iterator[tuple[subprocess.Popen[str], NetNs]]:
    """A HOLDER process (lo down) and corral's handle on its namespace."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"
            net = NetNs(proc.pid)
            try:
                yield proc, net
            finally:
                net.close()
        finally:
            proc.kill()


def test_await_loopback_returns_only_once_lo_is_up(
    holder: tuple[subprocess.Popen[str], NetNs],
) -> None:
    proc, net = holder
    assert proc.stdin is not None
    # The state corral used to hand out: unreachable.
    assert _connect_errno(net) == errno.ENETUNREACH
    proc.stdin.write("up\n")
    proc.stdin.flush()
    net.await_loopback(proc.pid, timeout_s=30)
    assert _connect_errno(net) == errno.ECONNREFUSED


def test_await_loopback_fails_closed_when_the_process_exits_first(
    holder: tuple[subprocess.Popen[str], NetNs],
) -> None:
    proc, net = holder
    assert proc.stdin is not None
    proc.stdin.close()  # it exits without bringing lo up
    # Decided by the process's exit (its pidfd), not by the timeout.
    with pytest.raises(SandboxStartError, match="exited before its loopback was up"):
        net.await_loopback(proc.pid, timeout_s=600)
    assert _connect_errno(net) == errno.ENETUNREACH


STARTS = 8


@pytest.mark.requires_sandbox
def test_the_namespace_backend_hands_out_a_network_whose_loopback_is_up(
    workspace: Path,
) -> None:
    be = load_backend(backend_config("namespace"))
    seen: list[int] = []
    spec = SandboxSpec(
        argv=("true",),
        workspace=str(workspace),
        env=(("PATH", "/usr/bin:/bin"),),
        network=NetworkSpec(),
    )
    for _ in range(STARTS):

        def hook(net: SandboxNet) -> None:
            # The earliest moment the host holds the sandbox's network.
            seen.append(_connect_errno(net))

        running = be.start(spec, network=hook)
        running.wait(30)
        running.close()
    names = [errno.errorcode.get(e, str(e)) for e in seen]
    print(f"connect() at hand-out over {STARTS} starts: {names}")
    assert seen == [errno.ECONNREFUSED] * STARTS, names


#: ioctl(NS_GET_USERNS): a descriptor of the user namespace owning a namespace.
_NS_GET_USERNS = 0xB701


def _owner_ino(ns_path: str) -> int:
    import fcntl
    import os

    fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        owner = fcntl.ioctl(fd, _NS_GET_USERNS)
    finally:
        os.close(fd)
    try:
        return os.fstat(owner).st_ino
    finally:
        os.close(owner)


@pytest.mark.requires_sandbox
def test_the_sandboxs_network_namespace_belongs_to_the_host_not_the_sandbox(
    workspace: Path,
) -> None:
    """As root corral's child makes the network namespace before bwrap
    (`mounts.make_net_ns`): it is owned by the host's user namespace, so no
    capability inside the sandbox's user namespace reaches it, its `lo` is up
    when handed out, and it is the one the command runs in. bwrap's
    `--unshare-net` (the unprivileged path) makes one owned by the sandbox's
    user namespace instead."""
    import os

    be = load_backend(backend_config("namespace"))
    seen: list[tuple[int, int, int]] = []

    def hook(net: SandboxNet) -> None:
        assert isinstance(net, NetNs)
        ns = f"/proc/self/fd/{net.namespace_fd()}"
        seen.append((os.stat(ns).st_ino, _owner_ino(ns), _connect_errno(net)))

    out = workspace / "out"
    spec = SandboxSpec(
        argv=("sh", "-c", "readlink /proc/self/ns/net > out; tail -n +3 /proc/net/dev >> out"),
        workspace=str(workspace),
        env=(("PATH", "/usr/bin:/bin"),),
        network=NetworkSpec(),
    )
    running = be.start(spec, network=hook)
    try:
        assert running.wait(30).exit == 0
    finally:
        running.close()
    ((ns_ino, owner_ino, connect_err),) = seen
    assert ns_ino != os.stat("/proc/self/ns/net").st_ino
    assert owner_ino == os.stat("/proc/self/ns/user").st_ino
    assert connect_err == errno.ECONNREFUSED
    link, *devices = out.read_text().splitlines()
    assert link == f"net:[{ns_ino}]"
    assert [d.split(":")[0].strip() for d in devices] == ["lo"]
