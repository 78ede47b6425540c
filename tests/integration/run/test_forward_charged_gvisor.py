"""A gVisor product's forwarded connections are the run's, none the coordinator's (issue 10).

The attack is test_forward_charged.py's against a gVisor product: it
floods every connection a verifier opens through the product-port forward
and the verifier reads none of them. A gVisor sandbox's loopback is
reached only by a relay started inside it with `runsc exec` whose stdio is
one end of a socketpair (`sandbox/gvisor/connect.py`); whoever starts it
holds, per open connection, the `runsc exec` process as its child, the
socketpair (created, so charged, there), the pipe of its stderr and a
thread that drains it. The coordinator's side (`HelperForwarder` and the
sandbox it started) runs in a child process placed in a memory cgroup of
its own, the sandbox under the run's cgroup as `corral run` places it.
What the host observes, from the kernel:

* every relay's `runsc exec` is a child of the forward helper (in the
  run's `helpers-forward` cgroup) and a member of the sandbox's cgroup,
  none is the coordinator's; the helper's TCP counter holds the stalled
  verifier side of every relay;
* the coordinator's memory counter (user + kernel memory, v1
  `memory.usage_in_bytes`), its threads, its children and the sockets and
  pipes in its /proc/PID/fd stay flat: O(1) per run.

Before the helper dialled gVisor itself, the coordinator gained a child, a
thread and a pipe per connection.
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

pytestmark = [
    pytest.mark.requires_root,
    pytest.mark.requires_cgroup,
    pytest.mark.requires_sandbox,
    pytest.mark.requires_runsc,
    pytest.mark.timeout(180),
]

KiB, MiB = 1 << 10, 1 << 20
#: `runsc exec` takes about a second per connection on a loaded host: few, but
#: each one's cost is counted exactly (a child, a thread, a pipe).
CONNS = 8
PORT = 8000

#: The product, inside gVisor: writes to every connection for as long as
#: writes are taken; says it listens by a file in its workspace.
_PRODUCT = f"""
import selectors, socket
s = socket.create_server(("127.0.0.1", {PORT}), backlog=256); s.setblocking(False)
sel = selectors.DefaultSelector(); sel.register(s, selectors.EVENT_READ)
b = bytes(1 << 16)
open("ready", "w").write("1")
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

#: The coordinator's side, as `corral run` drives it: the gVisor product
#: started under the run's cgroup, a listener it made (the verifier's
#: stand-in: host loopback) handed to the forward helper with the product's
#: `SandboxNet`.
_COORDINATOR = """
import socket, sys, time
from pathlib import Path
from corral.run.forward_helper import HelperForwarder
from corral.sandbox.backend import GVisorConfig
from corral.sandbox.spec import Limits, SandboxSpec
ws, parent, port, log, procs, code = sys.argv[1:7]
nets = []
spec = SandboxSpec(
    argv=("/usr/bin/python3", "-I", "-c", code),
    workspace=ws,
    env=(("PATH", "/usr/bin:/bin"), ("HOME", "/home/corral")),
    limits=Limits(memory_bytes=512 << 20),
)
sb = GVisorConfig().load().start(spec, parent_cgroup=parent, network=nets.append)
try:
    deadline = time.monotonic() + 60
    while not Path(ws, "ready").exists():
        assert time.monotonic() < deadline and sb.poll() is None, "the product never listened"
        time.sleep(0.1)
    fwd = HelperForwarder(lambda _target: None, procs.split(":"), Path(log))
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    addr = listener.getsockname()
    fwd.expose(listener, nets[0], int(port))
    print(f"ready {addr[1]} {fwd.pid}", flush=True)
    sys.stdin.read()
    fwd.close()
finally:
    sb.kill_all()
    sb.close()
"""

_JOIN = 'for f in $JOIN; do echo 0 > "$f" || exit 125; done; unset JOIN; exec "$@"'


def _mem(cg: RunCgroup, name: str, helper: str | None = None) -> int:
    d = cg.cgroup.dirs["memory"]
    if helper is not None:
        d = os.path.join(d, f"helpers-{helper}")
    return int(Path(d, name).read_text())


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    """Sockets and pipes `pid` holds."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(("socket:", "pipe:"))
        except OSError:
            continue
    return n


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out |= {int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()}
        except OSError:
            continue
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _relays(pids: set[int]) -> set[int]:
    """Those of `pids` that are a connection's `runsc exec` relay (nsenter ... exec)."""
    return {p for p in pids if b"\0exec\0" in _cmdline(p) and b"create_connection" in _cmdline(p)}


@pytest.fixture
def cgroups() -> Iterator[tuple[RunCgroup, RunCgroup]]:
    """(the run's cgroup, the coordinator's), each capped at 2 GiB."""
    made = []
    try:
        for _ in range(2):
            cg = RunCgroup.detect(new_id())
            assert cg is not None
            cg.create(2 << 30)
            made.append(cg)
        yield made[0], made[1]
    finally:
        for cg in made:
            cg.sweep()


def test_stalled_gvisor_forwards_are_charged_to_the_run_not_to_the_coordinator(
    cgroups: tuple[RunCgroup, RunCgroup], tmp_path: Path
) -> None:
    run, coord = cgroups
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o777)
    coordinator: subprocess.Popen[str] | None = None
    clients: list[socket.socket] = []
    try:
        args = (str(ws), run.relpath, str(PORT), str(tmp_path / "forward.log"))
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
                ":".join(run.helper_procs("forward")),
                _PRODUCT,
            ],
            env={**os.environ, "JOIN": " ".join(coord.cgroup.procs_files())},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert coordinator.stdout is not None
        line = coordinator.stdout.readline()
        assert line, f"the coordinator exited {coordinator.wait(30)} before it was ready"
        _, port, helper_s = line.split()
        helper, cpid = int(helper_s), coordinator.pid
        assert helper in run.pids() and cpid in coord.pids()
        base = (
            _mem(coord, "memory.usage_in_bytes"),
            _status(cpid, "Threads"),
            _fds(cpid),
            _children(cpid),
        )
        for _ in range(CONNS):
            c = socket.socket()
            # Smallest receive queue: the verifier reads nothing, the relay stalls at once.
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", int(port)))
            clients.append(c)
        # Decided from host-side effects: wait until every connection has its
        # relay inside (a `runsc exec`, whoever started it) and the stalled
        # relays' verifier sides are full (the helper's TCP counter).
        want = CONNS * 128 * KiB
        deadline = time.monotonic() + 120
        while True:
            relays = _relays(_children(helper) | _children(cpid))
            fwd_tcp = _mem(run, "memory.kmem.tcp.usage_in_bytes", "forward")
            if len(relays) >= CONNS and fwd_tcp >= want:
                break
            assert time.monotonic() < deadline, (
                f"relays never filled: {len(relays)} of {CONNS} started, "
                f"helpers-forward TCP {fwd_tcp / MiB:.1f} MiB"
            )
            time.sleep(0.1)
        mem = _mem(coord, "memory.usage_in_bytes") - base[0]
        threads = _status(cpid, "Threads") - base[1]
        fds = _fds(cpid) - base[2]
        theirs = _relays(_children(cpid) - base[3])
        ours = _relays(_children(helper))
        in_sandbox = run.pids()
        print(
            f"{CONNS} stalled gVisor forwards: relays of the helper {len(ours)}, of the "
            f"coordinator {len(theirs)}; helpers-forward TCP {fwd_tcp / MiB:.1f} MiB, memory "
            f"{_mem(run, 'memory.usage_in_bytes', 'forward') / MiB:.1f} MiB; coordinator "
            f"memory +{mem / MiB:.2f} MiB, threads +{threads}, sockets and pipes +{fds}"
        )
        # Every relay is the helper's, in the run's cgroup (the sandbox's, below it).
        assert len(ours) >= CONNS and ours <= in_sandbox
        # The coordinator pays O(1): no child, pipe or drain thread per
        # connection (its forward pool has at most 4 threads), no buffers.
        assert not theirs, f"the coordinator started {len(theirs)} relays"
        assert fds <= 2, f"the coordinator holds {fds} more sockets and pipes"
        assert threads <= 4, f"the coordinator has {threads} more threads"
        assert mem < 2 * MiB, f"the coordinator's cgroup grew {mem / MiB:.1f} MiB"
    finally:
        for c in clients:
            c.close()
        if coordinator is not None:
            assert coordinator.stdin is not None
            coordinator.stdin.close()
            try:
                coordinator.wait(30)
            except subprocess.TimeoutExpired:
                coordinator.kill()
                coordinator.wait()
            assert coordinator.stdout is not None
            coordinator.stdout.close()


#: Answers every connection with how many it accepted so far, then echoes.
_COUNTING = f"""
import socket, threading
s = socket.create_server(("127.0.0.1", {PORT}))
open("ready", "w").write("1")
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


def test_a_dialled_gvisor_product_is_connected_only_after_the_journal_said_yes(
    cgroups: tuple[RunCgroup, RunCgroup], tmp_path: Path
) -> None:
    from corral.run.forward_helper import HelperForwarder
    from corral.sandbox.backend import GVisorConfig, SandboxNet
    from corral.sandbox.spec import SandboxSpec

    run, _ = cgroups
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chmod(ws, 0o777)
    verdicts = [False, True]
    journaled: list[str] = []

    def on_connect(target: str) -> None:
        journaled.append(target)
        if not verdicts.pop(0):
            raise OSError("journal write failed")

    nets: list[SandboxNet] = []
    spec = SandboxSpec(
        argv=("/usr/bin/python3", "-I", "-c", _COUNTING),
        workspace=str(ws),
        env=(("PATH", "/usr/bin:/bin"),),
    )
    sb = GVisorConfig().load().start(spec, parent_cgroup=run.relpath, network=nets.append)
    fwd: HelperForwarder | None = None
    try:
        deadline = time.monotonic() + 60
        while not (ws / "ready").exists():
            assert time.monotonic() < deadline and sb.poll() is None, "the product never listened"
            time.sleep(0.1)
        fwd = HelperForwarder(on_connect, run.helper_procs("forward"), tmp_path / "forward.log")
        listener = socket.create_server(("127.0.0.1", 0))
        addr = listener.getsockname()
        fwd.expose(listener, nets[0], PORT)
        with socket.create_connection(addr, timeout=60) as c:
            c.sendall(b"refused")
            assert c.recv(100) == b""  # the journal refused: closed, nothing relayed
        with socket.create_connection(addr, timeout=60) as c:
            c.sendall(b"hello")
            # The product's first connection: the refused one never reached it.
            assert c.recv(100) == b"1:hello"
            # ...and its relay is the helper's child, not this process's.
            assert _relays(_children(fwd.pid)) and not _relays(_children(os.getpid()))
        assert journaled == [f"product:127.0.0.1:{PORT}"] * 2
    finally:
        if fwd is not None:
            fwd.close()
        sb.kill_all()
        sb.close()
