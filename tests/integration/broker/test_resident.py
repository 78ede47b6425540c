"""The resident broker: many sandboxes' listeners in one warm process, fail closed.

Each "sandbox" here is what the launcher hands over: a listening socket on a
loopback port (a namespace sandbox's is created inside its netns; the broker
cannot tell the difference). The attacks run against those ports.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from corral.broker.config import BrokerConfig, RuleConfig
from corral.broker.journal import JournalRow, read_rows
from corral.broker.resident import Attachment, attach_resident
from corral.errors import BrokerError

from .conftest import ServerFactory
from .testlib import Hit, Reply, raw_exchange, slow_chunks


def _config(host: str, port: int) -> str:
    return BrokerConfig.model_validate(
        {
            "rules": [RuleConfig(host=host, ports=(port,), allow_private=True)],
            "resolver_overrides": {"a.test": "127.0.0.1", "b.test": "127.0.0.1"},
            "system_dns": False,
        }
    ).to_json()


def _listener() -> socket.socket:
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    return lsock


def _wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


class _Harness:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock = root / "rb" / "resident.sock"
        self.attachments: list[Attachment] = []
        self.pids: set[int] = set()

    def attach(
        self, config: str, journal: str, session: str, idle_s: float = 30.0
    ) -> tuple[Attachment, int]:
        lsock = _listener()
        port = lsock.getsockname()[1]
        try:
            att = attach_resident(
                lsock,
                config,
                self.root / journal,
                run="r1",
                session=session,
                env="agent",
                socket_path=self.sock,
                idle_s=idle_s,
            )
        finally:
            lsock.close()
        self.attachments.append(att)
        self.pids.add(att.pid)
        return att, port

    def rows(self, journal: str) -> list[JournalRow]:
        return read_rows(self.root / journal)

    def close(self) -> None:
        for att in self.attachments:
            att.detach()
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(self.sock))
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            self.pids.add(int.from_bytes(creds[:4], sys.byteorder))
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def resident(tmp_path: Path) -> Iterator[_Harness]:
    # A private parent: the client refuses a base another uid could enter.
    root = tmp_path / "h"
    root.mkdir(mode=0o700)
    harness = _Harness(root)
    yield harness
    harness.close()


def _get(port: int, url: str, forged: str = "") -> bytes:
    request = f"GET {url} HTTP/1.1\r\nHost: x\r\n{forged}Connection: close\r\n\r\n"
    reply, _ = raw_exchange(port, request.encode())
    return reply


def test_two_sandboxes_have_their_own_policy_and_journal(
    servers: ServerFactory, resident: _Harness
) -> None:
    server = servers()
    a, port_a = resident.attach(_config("a.test", server.port), "a.sqlite", "sa")
    b, port_b = resident.attach(_config("b.test", server.port), "b.sqlite", "sb")
    assert a.pid == b.pid, "one resident serves both"

    # Each gets what its own policy allows, and only that.
    assert _get(port_a, f"http://a.test:{server.port}/from-a").startswith(b"HTTP/1.1 200")
    assert _get(port_b, f"http://b.test:{server.port}/from-b").startswith(b"HTTP/1.1 200")
    # Sandbox A tries B's host, claiming to be B in every way a request can.
    forged = "X-Corral-Session: sb\r\nX-Corral-Run: r1\r\nProxy-Authorization: Basic c2I6c2I=\r\n"
    denied = _get(port_a, f"http://b.test:{server.port}/a-as-b", forged)
    assert denied.startswith(b"HTTP/1.1 403")
    assert {h.path for h in server.hits} == {"/from-a", "/from-b"}

    assert a.detach() and b.detach()
    rows_a = [r for r in resident.rows("a.sqlite") if r.kind != "process_event"]
    rows_b = [r for r in resident.rows("b.sqlite") if r.kind != "process_event"]
    assert {(r.target, r.decision) for r in rows_a} == {
        (f"GET http://a.test:{server.port}/from-a", "allow"),
        (f"GET http://b.test:{server.port}/a-as-b", "deny"),
    }
    assert {(r.target, r.decision) for r in rows_b} == {
        (f"GET http://b.test:{server.port}/from-b", "allow")
    }
    assert {(r.session, r.run, r.env) for r in rows_a} == {("sa", "r1", "agent")}
    assert {(r.session, r.run, r.env) for r in rows_b} == {("sb", "r1", "agent")}
    starts = [r for r in resident.rows("a.sqlite") if r.target.startswith("broker_start")]
    assert starts and starts[0].detail.get("resident") is True


def test_sigkill_of_the_resident_cuts_egress_and_a_later_sandbox_gets_a_fresh_one(
    servers: ServerFactory, resident: _Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    def stream(hit: Hit) -> Reply:
        return 200, [("Content-Type", "application/octet-stream")], slow_chunks(400, 0.02)

    server = servers({"/stream": stream})
    att, port = resident.attach(_config("a.test", server.port), "a.sqlite", "sa")
    tunnel = socket.create_connection(("127.0.0.1", port), timeout=5)
    with tunnel:
        tunnel.sendall(f"CONNECT a.test:{server.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert tunnel.recv(4096).startswith(b"HTTP/1.1 200")
        tunnel.sendall(b"GET /stream HTTP/1.1\r\nHost: a.test\r\n\r\n")
        assert len(tunnel.recv(65536)) > 0

        os.kill(att.pid, signal.SIGKILL)
        assert _wait_gone(att.pid)

        received = 0
        tunnel.settimeout(3)
        with contextlib.suppress(ConnectionResetError):
            while chunk := tunnel.recv(65536):
                received += len(chunk)
        assert received < 400 * 1024, "the tunnel outlived the broker"
    # No stale listener answers: the dead resident held the only copy.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert not att.alive()
    assert att.detach() is False

    fresh, port2 = resident.attach(_config("a.test", server.port), "a2.sqlite", "s2")
    assert fresh.pid != att.pid
    assert _get(port2, f"http://a.test:{server.port}/after").startswith(b"HTTP/1.1 200")


def test_egress_broker_reports_the_death(
    servers: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral.broker.attach import EgressBroker

    server = servers()
    root = tmp_path / "h"
    root.mkdir(mode=0o700)
    lsock = _listener()
    port = lsock.getsockname()[1]

    class _Net:
        def listen(self, _port: int) -> socket.socket:
            return lsock

    egress = EgressBroker(
        _config("a.test", server.port),
        root / "j.sqlite",
        run="r1",
        session="s1",
        env="exec",
        resident=True,
        resident_socket=root / "rb" / "resident.sock",
    )
    egress.attach(_Net())
    assert egress.attachment is not None and egress.alive()
    pid = egress.attachment.pid
    try:
        os.kill(pid, signal.SIGKILL)
        assert _wait_gone(pid)
        assert not egress.alive()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        egress.stop()
        assert f"resident broker (pid {pid}) died" in capsys.readouterr().err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_idle_resident_exits_and_leaves_nothing(servers: ServerFactory, resident: _Harness) -> None:
    server = servers()
    att, port = resident.attach(_config("a.test", server.port), "a.sqlite", "sa", idle_s=0.2)
    proc = psutil.Process(att.pid)
    assert stat.S_IMODE(os.stat(resident.sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(resident.sock.parent).st_mode) == 0o700
    assert _get(port, f"http://a.test:{server.port}/x").startswith(b"HTTP/1.1 200")
    assert att.detach()
    # Detached: the listener is shut at once, whatever the idle timer does.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert _wait_gone(proc.pid), "the idle resident did not exit"
    assert not os.path.lexists(resident.sock)


@pytest.fixture
def open_resident() -> Iterator[_Harness]:
    # Outside pytest's private tmp tree: another uid must be able to reach the socket.
    root = Path(tempfile.mkdtemp(prefix="corral-resident-test-"))
    harness = _Harness(root)
    try:
        yield harness
    finally:
        harness.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.requires_root
def test_other_uid_is_refused(servers: ServerFactory, open_resident: _Harness) -> None:
    resident = open_resident
    server = servers()
    att, _port = resident.attach(_config("a.test", server.port), "a.sqlite", "sa")
    # Open the directories and the socket up, as a misconfiguration would:
    # the SO_PEERCRED check must still refuse another uid.
    for path in (resident.root, resident.sock.parent):
        os.chmod(path, 0o755)
    os.chmod(resident.sock, 0o666)
    journal = resident.root / "evil.sqlite"
    code = f"""
import json, os, socket, struct
os.setgid(65534); os.setuid(65534)
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4)
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect({str(resident.sock)!r})
body = json.dumps({{"op": "attach", "config": {_config("a.test", server.port)!r},
    "journal": {str(journal)!r}, "run": "r", "session": "evil", "env": "exec"}}).encode()
try:
    c.sendmsg([struct.pack("!I", len(body)), body],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", l.fileno()))])
    c.settimeout(5)
    print(repr(c.recv(100)) if c.recv(100, socket.MSG_PEEK) else "closed")
except (BrokenPipeError, ConnectionResetError):
    print("closed")
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=False
    )
    assert out.stdout.strip() == "closed", (out.stdout, out.stderr)
    assert not journal.exists()
    assert att.alive()


def test_a_refused_config_is_a_clear_error(resident: _Harness) -> None:
    with pytest.raises(BrokerError, match="broker refused the sandbox"):
        resident.attach('{"rules": [{"host": ""}]}', "a.sqlite", "sa")
