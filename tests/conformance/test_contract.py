"""The contract every backend keeps, written once against the Protocol.

Run against each backend in `cases.CASES` (the namespace backend for real,
the fake, and gVisor/microVM where installed). Every assertion is on what
the host observes: the ExecResult the backend reports, files the command
wrote to the workspace, host processes and cgroups left behind. Nothing
decides from how long something took: waits only bound a hang.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from corral.sandbox.backend import SandboxNet
from corral.sandbox.spec import EXIT_REASONS, Limits
from tests.conformance.cases import Case
from tests.conformance.helpers import PY, free_port, pids_with, run, size, spec, until


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (("/bin/sh", "-c", "exit 0"), 0),
        (("/bin/sh", "-c", "exit 3"), 3),
        (("/bin/sh", "-c", "exit 120"), 120),
        (("corral-no-such-command",), 127),
    ],
    ids=["0", "3", "120", "127"],
)
def test_exit_codes(case: Case, ws: Path, argv: tuple[str, ...], code: int) -> None:
    result = run(case.make(), spec(ws, *argv))
    assert (result.exit, result.reason) == (code, "exited")


def test_timeout(case: Case, ws: Path) -> None:
    result = run(case.make(), spec(ws, "/bin/sleep", "1000"), timeout_s=0.5)
    assert (result.exit, result.reason) == (124, "timeout")


def test_oom(case: Case, ws: Path) -> None:
    grab = "b = b'x' * (512 << 20)"  # written, so every page is charged
    result = run(case.make(), spec(ws, PY, "-c", grab, limits=Limits(memory_bytes=64 << 20)))
    assert (result.exit, result.reason) == (137, "oom")
    assert result.oom_kills >= 1


def test_kill_all(case: Case, ws: Path) -> None:
    running = case.make().start(spec(ws, "/bin/sleep", "1000"))
    try:
        assert running.poll() is None
        running.kill_all()
        running.kill_all()  # idempotent
        result = running.wait(60)
    finally:
        running.close()
    assert (result.exit, result.reason) == (137, "killed")
    assert result.reason in EXIT_REASONS


def test_usage(case: Case, ws: Path) -> None:
    # About a second of CPU on an idle core; the counter, not the clock, is checked.
    burn = "x = 0\nfor i in range(4 * 10**6):\n    x += i\nopen('done', 'w').write('1')"
    running = case.make().start(spec(ws, PY, "-c", burn))
    try:
        result = running.wait(120)
    finally:
        running.close()
    assert (result.exit, result.reason) == (0, "exited")
    assert (ws / "done").exists()
    assert result.cpu_s >= 0.05, result


def test_freeze_thaw(case: Case, ws: Path, tmp_path: Path) -> None:
    grow = ws / "grow"
    loop = "while :; do echo x >> grow; done"
    running = case.make().start(spec(ws, "/bin/sh", "-c", loop))
    ref = None
    try:
        until(lambda: size(grow) > 0, "the sandboxed counter grows")
        running.freeze()
        frozen_at = size(grow)
        # A host process runs the same loop meanwhile: once it has made this
        # much progress, an unfrozen sandbox would have made some too.
        ref_file = tmp_path / "ref"
        ref = subprocess.Popen(["/bin/sh", "-c", f"while :; do echo x >> {ref_file}; done"])
        until(lambda: size(ref_file) >= 4000, "the host reference counter grows", 120)
        assert size(grow) == frozen_at, "a frozen sandbox made progress"
        running.thaw()
        until(lambda: size(grow) > frozen_at, "the thawed counter grows again")
    finally:
        if ref is not None:
            ref.kill()
            ref.wait()
        running.close()


def test_interrupt(case: Case, ws: Path) -> None:
    running = case.make().start(spec(ws, "/bin/sleep", "1000"))
    try:
        result = running.interrupt(signal.SIGTERM)
    finally:
        running.close()
    assert (result.exit, result.reason) == (128 + signal.SIGTERM, "killed")


def test_close_idempotent(case: Case, ws: Path) -> None:
    mark = f"corral-conformance-close-{os.getpid()}-{os.urandom(4).hex()}"
    running = case.make().start(spec(ws, "/bin/sh", "-c", f"sleep 1000; : {mark}"))
    until(lambda: bool(pids_with(mark)), "the command runs")
    running.close()
    running.close()
    assert running.poll() is not None
    until(lambda: not pids_with(mark), "no process of the sandbox left after close")
    assert case.leftover_cgroups(os.getpid()) == []


def test_layers_read_only(case: Case, ws: Path) -> None:
    running = case.make().start(spec(ws, "/bin/sh", "-c", "exit 0"))
    try:
        layers = running.layers
        assert isinstance(layers, Mapping) and layers
        with pytest.raises(TypeError):
            layers["broker"] = True  # type: ignore[index]
        result = running.wait(60)
    finally:
        running.close()
    assert "broker" not in result.layers


def test_network_listen(case: Case, ws: Path) -> None:
    """The host listens on the sandbox's loopback; the command connects to 127.0.0.1:port."""
    port = free_port()
    listeners: list[socket.socket] = []

    def attach(net: SandboxNet) -> None:
        listeners.append(net.listen(port))

    hello = (
        f"import socket\nsocket.create_connection(('127.0.0.1', {port})).sendall(b'from-inside')\n"
    )
    backend = case.make()
    running = backend.start(spec(ws, PY, "-c", hello), network=attach)
    try:
        assert len(listeners) == 1
        listeners[0].settimeout(60)
        conn, _ = listeners[0].accept()
        with conn:
            conn.settimeout(60)
            assert conn.recv(64) == b"from-inside"
        result = running.wait(60)
    finally:
        running.close()
        for s in listeners:
            s.close()
    assert result.exit == 0


def test_network_connect(case: Case, ws: Path) -> None:
    """A server inside the sandbox; the host connects to it through the SandboxNet."""
    port = free_port()
    nets: list[SandboxNet] = []
    serve = (
        "import socket\n"
        f"s = socket.create_server(('127.0.0.1', {port}))\n"
        "open('ready', 'w').write('1')\n"
        "c, _ = s.accept()\n"
        "c.sendall(b'from-server-inside')\n"
        "c.close()\n"
    )
    running = case.make().start(spec(ws, PY, "-c", serve), network=nets.append)
    try:
        until((ws / "ready").exists, "the server inside listens")
        with nets[0].connect(port) as conn:
            conn.settimeout(60)
            assert conn.recv(64) == b"from-server-inside"
        result = running.wait(60)
    finally:
        running.close()
    assert result.exit == 0


def test_leftovers_counted(case: Case, ws: Path) -> None:
    mark = f"corral-conformance-left-{os.getpid()}-{os.urandom(4).hex()}"
    # One leftover process: `&` has forked it before the shell exits.
    argv = ("/bin/sh", "-c", f"{PY} -c 'import time; time.sleep(1000)' {mark} & exit 0")
    result = run(case.make(), spec(ws, *argv))
    assert (result.exit, result.reason) == (0, "exited")
    assert result.processes_killed_at_end == 1
    until(lambda: not pids_with(mark), "the leftover was killed")


_OWNER = """
import sys, time
sys.path[:0] = [sys.argv[3]]
from tests.conformance.cases import by_name
from tests.conformance.helpers import spec
from pathlib import Path
running = by_name(sys.argv[1]).make().start(
    spec(Path(sys.argv[2]), "/bin/sh", "-c", "sleep 1000; : " + sys.argv[4]))
print("started", flush=True)
time.sleep(1000)
"""


def test_owner_killed(case: Case, ws: Path) -> None:
    """kill -9 of the process that started the sandbox leaves no process (nor, once
    the backend runs again, cgroup) behind."""
    mark = f"corral-conformance-owner-{os.getpid()}-{os.urandom(4).hex()}"
    root = str(Path(__file__).resolve().parents[2])
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, case.name, str(ws), root, mark], stdout=subprocess.PIPE
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline() == b"started\n"
        until(lambda: bool(pids_with(mark)), "the command runs")
        owner.kill()
        owner.wait()
        until(lambda: not pids_with(mark), "the sandbox died with its owner")
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    # The next start sweeps what a killed owner left.
    run(case.make(), spec(ws, "/bin/sh", "-c", "exit 0"))
    assert case.leftover_cgroups(owner.pid) == []


def test_check_and_preview(case: Case, ws: Path) -> None:
    """`check` names each layer (None: available); `preview` describes a start, starting nothing."""
    backend = case.make()
    s = spec(ws, "/bin/sh", "-c", "echo started > marker")
    layers = backend.check(s)
    assert layers and all(why is None or (isinstance(why, str) and why) for why in layers.values())
    # This host passed the case's marker: everything the backend needs is here.
    assert {k: v for k, v in layers.items() if v is not None} == {}
    argv = backend.preview(s)
    assert argv and all(isinstance(a, str) for a in argv)
    assert not (ws / "marker").exists()
