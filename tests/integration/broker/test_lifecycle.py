"""The broker process contract: ready, stop, SIGKILL, inherited sockets, failures."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from corral.broker.config import BrokerConfig, RouteConfig, RuleConfig
from corral.broker.process import start_broker
from corral.errors import BrokerError

from .conftest import BrokerFactory, ServerFactory
from .testlib import Hit, Reply, raw_exchange, slow_chunks


def _allow(port: int, **extra: object) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "rules": [RuleConfig(host="ok.test", ports=(port,), allow_private=True)],
            "resolver_overrides": {"ok.test": "127.0.0.1"},
            "system_dns": False,
            **extra,
        }
    )


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _journal_targets(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [str(r[0]) for r in conn.execute("SELECT target FROM observations")]
    finally:
        conn.close()


def test_sigkill_loses_no_acknowledged_row(servers: ServerFactory, brokers: BrokerFactory) -> None:
    server = servers()
    broker = brokers(_allow(server.port))
    acknowledged: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(tid: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=5)
        i = 0
        try:
            while not stop.is_set():
                path = f"/ack/{tid}/{i}"
                conn.request("GET", f"http://ok.test:{server.port}{path}")
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    with lock:
                        acknowledged.append(f"GET http://ok.test:{server.port}{path}")
                i += 1
        except (OSError, http.client.HTTPException):
            return
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(acknowledged) < 150 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(broker.process.pid, signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join(10)
    assert broker.process.kill() == -signal.SIGKILL
    assert len(acknowledged) >= 150

    assert _integrity(broker.journal) == "ok"
    journaled = set(_journal_targets(broker.journal))
    assert set(acknowledged) <= journaled
    # Stronger: every request that reached the upstream was journaled first.
    reached = {f"GET http://ok.test:{server.port}{h.path}" for h in server.hits}
    assert reached <= journaled


def test_broker_death_cuts_transfers_and_refuses_new_connections(
    servers: ServerFactory, brokers: BrokerFactory
) -> None:
    def stream(hit: Hit) -> Reply:
        return 200, [("Content-Type", "application/octet-stream")], slow_chunks(400, 0.02)

    server = servers({"/stream": stream})
    # The launcher's way: it creates the listening socket and passes the fd.
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    try:
        broker = brokers(_allow(server.port), listen_fds=(lsock.fileno(),))
    finally:
        lsock.close()
    assert broker.port == port

    plain = socket.create_connection(("127.0.0.1", port), timeout=5)
    tunnel = socket.create_connection(("127.0.0.1", port), timeout=5)
    with plain, tunnel:
        plain.sendall(
            f"GET http://ok.test:{server.port}/stream HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        tunnel.sendall(f"CONNECT ok.test:{server.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert tunnel.recv(4096).startswith(b"HTTP/1.1 200")
        tunnel.sendall(b"GET /stream HTTP/1.1\r\nHost: ok.test\r\n\r\n")
        for sock in (plain, tunnel):
            assert len(sock.recv(65536)) > 0

        os.kill(broker.process.pid, signal.SIGKILL)
        broker.process.kill()

        for sock in (plain, tunnel):
            received = 0
            sock.settimeout(3)
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    received += len(chunk)
            assert received < 400 * 1024
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_sigterm_stops_cleanly(servers: ServerFactory, brokers: BrokerFactory) -> None:
    server = servers()
    broker = brokers(_allow(server.port))
    status, _ = raw_exchange(
        broker.port, f"GET http://ok.test:{server.port}/x HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    )
    assert status.startswith(b"HTTP/1.1 200")
    assert broker.process.stop() == 0
    rows = broker.rows()
    assert [r.target.split()[0] for r in rows if r.kind == "process_event"] == [
        "broker_start",
        "broker_stop",
    ]
    assert _integrity(broker.journal) == "ok"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", broker.port), timeout=2).close()


def test_failing_journal_write_denies_the_action(
    servers: ServerFactory, brokers: BrokerFactory
) -> None:
    server = servers()
    broker = brokers(_allow(server.port))
    conn = sqlite3.connect(broker.journal)
    try:
        conn.execute(
            "CREATE TRIGGER sabotage BEFORE INSERT ON observations"
            " BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
        )
        conn.commit()
    finally:
        conn.close()
    reply, _ = raw_exchange(
        broker.port, f"GET http://ok.test:{server.port}/x HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    )
    assert reply.startswith(b"HTTP/1.1 503")
    assert b"X-Corral-Denied: journal-unavailable" in reply
    assert server.hits == []


def test_unix_socket_listener(servers: ServerFactory, tmp_path: Path) -> None:
    server = servers()
    path = str(tmp_path / "broker.sock")
    process = start_broker(_allow(server.port), tmp_path / "j.sqlite", listen_unix=[path])
    try:
        ready = process.wait_ready(20)
        assert ready.listen[0]["path"] == path
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(path)
            sock.sendall(f"GET http://ok.test:{server.port}/u HTTP/1.0\r\n\r\n".encode())
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200")
        assert reply.endswith(b"ok GET /u\n")
    finally:
        assert process.stop() == 0


@pytest.mark.parametrize(
    ("case", "status", "message"),
    [
        ("missing-secret", 2, "CORRAL_TEST_ABSENT_KEY"),
        ("bad-journal", 1, "cannot open journal"),
        ("not-listening", 1, "not listening"),
    ],
)
def test_start_failures_are_reported(tmp_path: Path, case: str, status: int, message: str) -> None:
    config = BrokerConfig()
    journal = tmp_path / "j.sqlite"
    fds: tuple[int, ...] = ()
    listen: tuple[str, ...] = ("127.0.0.1:0",)
    sock = socket.socket()
    if case == "missing-secret":
        config = BrokerConfig(
            routes={
                "r": RouteConfig(
                    upstream="https://api.test",
                    inject_header={"x-api-key": "env:CORRAL_TEST_ABSENT_KEY"},
                )
            }
        )
    elif case == "bad-journal":
        journal = tmp_path / "missing-dir" / "j.sqlite"
    else:
        fds, listen = (sock.fileno(),), ()
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_TEST_ABSENT_KEY"}
    try:
        process = start_broker(config, journal, listen=listen, listen_fds=fds, environ=env)
        with pytest.raises(BrokerError, match=message):
            process.wait_ready(20)
        assert process.poll() == status
    finally:
        sock.close()


def test_broker_exits_when_its_parent_dies(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from corral.broker.config import BrokerConfig\n"
        "from corral.broker.process import start_broker\n"
        f"j = {str(tmp_path / 'j.sqlite')!r}\n"
        "p = start_broker(BrokerConfig(), j, listen=['127.0.0.1:0'])\n"
        "p.wait_ready(20)\n"
        "print(p.pid, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("broker outlived its parent")
