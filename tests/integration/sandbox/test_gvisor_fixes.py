"""gVisor: connect into the sandbox's loopback, exit 127/126, judged on the host."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from corral.sandbox.backend import GVisorConfig, SandboxNet
from corral.sandbox.gvisor import GVisorBackend
from tests.conformance.helpers import PY, free_port, pids_with, run, spec, until

pytestmark = [pytest.mark.requires_runsc, pytest.mark.requires_root, pytest.mark.requires_cgroup]


def test_command_exiting_128_with_runsc_words_stays_128(tmp_path: Path) -> None:
    """The command writes runsc's not-found error to its stderr and exits 128: only
    runsc's own log may turn 128 into 127."""
    forged = (
        "echo 'running container: starting container: starting root container: starting "
        'sandbox: error finding executable "x" in PATH []: no such file or directory\' >&2;'
        " exit 128"
    )
    result = run(GVisorConfig().load(), spec(tmp_path, "/bin/sh", "-c", forged))
    assert (result.exit, result.reason) == (128, "exited")


def test_not_executable_is_126(tmp_path: Path) -> None:
    result = run(GVisorConfig().load(), spec(tmp_path, "/etc/passwd"))
    assert (result.exit, result.reason) == (126, "exited")


def test_connect_refused_and_forwarder_dies_with_sandbox(tmp_path: Path) -> None:
    """Nothing listens inside: connect() refuses. A forwarder left connected is a host
    process (runsc exec) that teardown kills with the sandbox."""
    port, other = free_port(), free_port()
    serve = (
        "import socket, time\n"
        f"s = socket.create_server(('127.0.0.1', {port}))\n"
        "open('ready', 'w').write('1')\n"
        "c, _ = s.accept()\n"
        "time.sleep(1000)\n"
    )
    nets: list[SandboxNet] = []
    running = GVisorBackend(GVisorConfig()).start(
        spec(tmp_path, PY, "-c", serve), network=nets.append
    )
    container = os.path.basename(running.base)
    try:
        until((tmp_path / "ready").exists, "the server inside listens")
        with pytest.raises(ConnectionRefusedError):
            nets[0].connect(other)
        conn = nets[0].connect(port)
        until(lambda: bool(pids_with(container + "\0" + PY)), "the forwarder runs")
    finally:
        running.close()
    until(lambda: not pids_with(container + "\0" + PY), "no forwarder left after close")
    conn.settimeout(30)
    assert conn.recv(64) == b""  # the sandbox's end is gone
    conn.close()


def test_connect_sees_the_sandbox_loopback_not_the_host(tmp_path: Path) -> None:
    """A host service on 127.0.0.1:port is not what connect(port) reaches."""
    host = socket.create_server(("127.0.0.1", 0))
    port = host.getsockname()[1]
    nets: list[SandboxNet] = []
    running = (
        GVisorConfig()
        .load()
        .start(spec(tmp_path, "/bin/sh", "-c", "echo 1 > ready; sleep 1000"), network=nets.append)
    )
    try:
        until((tmp_path / "ready").exists, "the sandbox runs")
        with pytest.raises(ConnectionRefusedError):
            nets[0].connect(port)
    finally:
        running.close()
        host.close()


def test_etc_is_the_allowlist_read_only_and_leaves_no_host_mount(tmp_path: Path) -> None:
    """The command lists /etc and tries to write into it and into a bound entry; while it
    runs, no host mount lies under corral's gVisor state (the binds live in runsc's own
    mount namespace), and the host's /etc is untouched."""
    from corral.sandbox.bwrap import ETC_ALLOWLIST
    from corral.sandbox.gvisor.backend import STATE_ROOT

    probe = (
        "import os, time\n"
        "open('etc.txt', 'w').write('\\n'.join(sorted(os.listdir('/etc'))))\n"
        "for p in ('/etc/corral-planted', '/etc/ssl/corral-planted'):\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
        "open('ready', 'w').write('1')\n"
        "time.sleep(1000)\n"
    )
    running = GVisorConfig().load().start(spec(tmp_path, PY, "-c", probe))
    try:
        until((tmp_path / "ready").exists, "the probe ran")
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            ours = [ln for ln in fh if f" {STATE_ROOT}/" in ln]
        assert ours == []
    finally:
        running.close()
    listed = set((tmp_path / "etc.txt").read_text().split("\n"))
    want = {e for e in ETC_ALLOWLIST if os.path.lexists(f"/etc/{e}")} | {"passwd", "group", "hosts"}
    assert listed == want
    assert not os.path.lexists("/etc/corral-planted")
    assert not os.path.lexists("/etc/ssl/corral-planted")
